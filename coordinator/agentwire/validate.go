package agentwire

import (
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/nodefence/nodefence/proto/nodefence/agent/v1"
	"github.com/nodefence/nodefence/services/fault"
	"github.com/nodefence/nodefence/services/identity"
)

// Bounds of what an agent may send. Names follow Kubernetes' rules (a node name is a DNS
// subdomain, a label name a qualified name, a label value at most 63 characters), free text is
// capped at MaxText.
const (
	// MaxText caps free-text fields (condition reason and message).
	MaxText = 1024
	// MaxLabels caps the labels of a hello.
	MaxLabels = 64
	// MaxCandidates caps the pods of one eviction proposal.
	MaxCandidates = 1000
	// maxLabelValue is Kubernetes' label value length.
	maxLabelValue = 63
	// maxShortText caps identifiers such as a boot id or an agent version.
	maxShortText = 128
)

// ValidateHello checks every field of a hello, listing each problem with its field name.
func ValidateHello(h *agentv1.Hello) error {
	var v fault.Invalid
	if err := identity.ValidName(h.GetNodeName()); err != nil {
		v.Add("hello.node_name", "%v", err)
	}
	labelValue(&v, "hello.zone", h.GetZone())
	labelValue(&v, "hello.region", h.GetRegion())
	shortText(&v, "hello.boot_id", h.GetBootId())
	shortText(&v, "hello.agent_version", h.GetAgentVersion())
	if len(h.GetLabels()) > MaxLabels {
		v.Add("hello.labels", "%d labels, more than %d", len(h.GetLabels()), MaxLabels)
	} else {
		for k, val := range h.GetLabels() {
			if !validLabelName(k) {
				v.Add("hello.labels", "label name %q is not a Kubernetes qualified name (at most 253+63 characters)", clip(k))
			}
			labelValue(&v, "hello.labels["+clip(k)+"]", val)
		}
	}
	if c := h.GetCapacity(); c != nil && (c.GetMemoryBytes() < 0 || c.GetCpuMillis() < 0 || c.GetPids() < 0) {
		v.Add("hello.capacity", "must not be negative")
	}
	if w := h.GetWatchdog(); w != nil {
		validateWatchdog(&v, "hello.watchdog", w)
	}
	return v.Err()
}

// ValidateEvent checks a condition change, a shutdown event, an eviction proposal or an eviction
// report: known enum values, non-negative durations, capped text, Kubernetes names. Heartbeats and
// samples pass (agentwire decodes them, bounded by the message size).
func ValidateEvent(m *agentv1.ConnectRequest) error {
	var v fault.Invalid
	switch msg := m.GetMsg().(type) {
	case *agentv1.ConnectRequest_Condition:
		c := msg.Condition
		if _, ok := agentv1.ConditionType_name[int32(c.GetType())]; !ok || c.GetType() == agentv1.ConditionType_CONDITION_TYPE_UNSPECIFIED {
			v.Add("condition.type", "unknown condition type %d", c.GetType())
		}
		if _, ok := agentv1.ConditionStatus_name[int32(c.GetStatus())]; !ok || c.GetStatus() == agentv1.ConditionStatus_CONDITION_STATUS_UNSPECIFIED {
			v.Add("condition.status", "unknown condition status %d", c.GetStatus())
		}
		text(&v, "condition.reason", c.GetReason())
		text(&v, "condition.message", c.GetMessage())
		if t := c.GetTransitionTime(); t != nil && t.CheckValid() != nil {
			v.Add("condition.transition_time", "not a valid timestamp")
		}
	case *agentv1.ConnectRequest_Shutdown:
		s := msg.Shutdown
		if _, ok := agentv1.ShutdownPhase_name[int32(s.GetPhase())]; !ok || s.GetPhase() == agentv1.ShutdownPhase_SHUTDOWN_PHASE_UNSPECIFIED {
			v.Add("shutdown.phase", "unknown shutdown phase %d", s.GetPhase())
		}
		duration(&v, "shutdown.grace_period", s.GetGracePeriod())
		if t := s.GetAt(); t != nil && t.CheckValid() != nil {
			v.Add("shutdown.at", "not a valid timestamp")
		}
	case *agentv1.ConnectRequest_Candidates:
		c := msg.Candidates
		shortText(&v, "candidates.signal", c.GetSignal())
		if len(c.GetCandidates()) > MaxCandidates {
			v.Add("candidates.candidates", "%d pods, more than %d", len(c.GetCandidates()), MaxCandidates)
			break
		}
		for _, p := range c.GetCandidates() {
			if len(p.GetNamespace()) > 63 || len(p.GetName()) > 253 || len(p.GetUid()) > maxShortText {
				v.Add("candidates.candidates", "a pod's namespace, name or uid is longer than Kubernetes allows")
				break
			}
			duration(&v, "candidates.candidates.grace_period", p.GetGracePeriod())
		}
	case *agentv1.ConnectRequest_Eviction:
		validateEvictionReport(&v, msg.Eviction)
	case *agentv1.ConnectRequest_Watchdog:
		validateWatchdog(&v, "watchdog", msg.Watchdog)
	}
	return v.Err()
}

// validateEvictionReport checks an eviction report: the pod by Kubernetes' rules (a namespace is a
// DNS label, a pod name a DNS subdomain), a known kind, printable identifiers, capped text.
func validateEvictionReport(v *fault.Invalid, r *agentv1.EvictionReport) {
	if !dnsLabel(r.GetNamespace()) {
		v.Add("eviction.namespace", "%q is not a Kubernetes namespace name (a DNS label of at most 63 characters)", clip(r.GetNamespace()))
	}
	if err := identity.ValidName(r.GetName()); err != nil {
		v.Add("eviction.name", "not a Kubernetes pod name: %v", err)
	}
	shortText(v, "eviction.uid", r.GetUid())
	shortText(v, "eviction.signal", r.GetSignal())
	if _, ok := agentv1.EvictionKind_name[int32(r.GetKind())]; !ok || r.GetKind() == agentv1.EvictionKind_EVICTION_KIND_UNSPECIFIED {
		v.Add("eviction.kind", "unknown eviction kind %d", r.GetKind())
	}
	duration(v, "eviction.grace_period", r.GetGracePeriod())
	text(v, "eviction.message", r.GetMessage())
	if t := r.GetAt(); t != nil && t.CheckValid() != nil {
		v.Add("eviction.at", "not a valid timestamp")
	}
}

// dnsLabel checks an RFC 1123 label: 1-63 lower-case letters, digits and '-', starting and ending
// with a letter or digit.
func dnsLabel(s string) bool {
	return len(s) <= maxLabelValue && !strings.Contains(s, ".") && identity.ValidName(s) == nil
}

func duration(v *fault.Invalid, field string, d *durationpb.Duration) {
	if d == nil {
		return
	}
	if d.CheckValid() != nil || d.AsDuration() < 0 {
		v.Add(field, "must be a valid, non-negative duration")
	}
}

func text(v *fault.Invalid, field, s string) {
	if len(s) > MaxText {
		v.Add(field, "%d bytes, more than %d", len(s), MaxText)
	} else if !utf8.ValidString(s) {
		v.Add(field, "not valid UTF-8")
	}
}

func shortText(v *fault.Invalid, field, s string) {
	if len(s) > maxShortText {
		v.Add(field, "%d bytes, more than %d", len(s), maxShortText)
		return
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			v.Add(field, "must be printable text")
			return
		}
	}
}

// labelValue checks a Kubernetes label value: empty, or at most 63 characters of [A-Za-z0-9-_.]
// starting and ending with a letter or digit.
func labelValue(v *fault.Invalid, field, s string) {
	if s == "" {
		return
	}
	if len(s) > maxLabelValue || !labelPart(s) {
		v.Add(field, "%q is not a Kubernetes label value (at most %d letters, digits, '-', '_', '.', starting and ending with a letter or digit)", clip(s), maxLabelValue)
	}
}

// validLabelName checks a qualified name: an optional DNS-subdomain prefix and '/', then a name
// part of at most 63 characters.
func validLabelName(s string) bool {
	prefix, name, ok := strings.Cut(s, "/")
	if !ok {
		name, prefix = prefix, ""
	} else if identity.ValidName(prefix) != nil {
		return false
	}
	return name != "" && len(name) <= maxLabelValue && labelPart(name)
}

func labelPart(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && c != '-' && c != '_' && c != '.' {
			return false
		}
		if !alnum && (i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// MaxWatchdogTimeout bounds a reported watchdog timeout (node-agent/watchdog.MaxTimeout).
const MaxWatchdogTimeout = 10 * time.Minute

// validateWatchdog checks a watchdog report: an armed watchdog has a timeout from 1 s to
// MaxWatchdogTimeout.
func validateWatchdog(v *fault.Invalid, field string, w *agentv1.WatchdogState) {
	t := w.GetTimeout()
	if t != nil && t.CheckValid() != nil {
		v.Add(field+".timeout", "not a valid duration")
		return
	}
	if w.GetArmed() && (t.AsDuration() < time.Second || t.AsDuration() > MaxWatchdogTimeout) {
		v.Add(field+".timeout", "an armed watchdog's timeout must be from 1s to %s, not %s", MaxWatchdogTimeout, t.AsDuration())
	}
}
