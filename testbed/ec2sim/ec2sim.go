// Package ec2sim is an in-process Amazon EC2 Query API endpoint on 127.0.0.1 for tests and demos.
//
// It speaks the real wire format: POST form-encoded bodies (Action=..., Version=2016-11-15,
// InstanceId.N, Filter.N.Name / Filter.N.Value.M, Force), XML responses in the
// http://ec2.amazonaws.com/doc/2016-11-15/ namespace, and EC2's XML error documents. Every request
// must carry a valid AWS Signature Version 4 (AWS4-HMAC-SHA256) for the configured key, region and
// service "ec2"; the signature is recomputed and compared.
//
// Instances move through EC2's states with time: StopInstances takes a running instance to
// stopping, then stopped after the transition time; StartInstances takes a stopped one to pending,
// then running. Per-instance faults: stuck (Stop/Start accepted, nothing happens), flapping
// (DescribeInstances alternates running and stopped), API error (Stop/Start fail with
// IncorrectInstanceState); the whole endpoint can hang.
//
// The endpoint fails by default: without configured keys every request is refused (AuthFailure),
// unknown instances are InvalidInstanceID.NotFound and unknown actions InvalidAction.
package ec2sim

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodefence/nodefence/testbed/hanglistener"
)

// Namespace is the EC2 API XML namespace.
const Namespace = "http://ec2.amazonaws.com/doc/2016-11-15/"

// EC2 instance state codes.
var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

// Fault is a failure mode of one instance.
type Fault int

const (
	// FaultNone is a healthy instance.
	FaultNone Fault = iota
	// FaultStuck accepts StopInstances and StartInstances and never changes state.
	FaultStuck
	// FaultFlapping is described alternately running and stopped.
	FaultFlapping
	// FaultAPIError fails StopInstances and StartInstances with IncorrectInstanceState.
	FaultAPIError
)

// Config configures the endpoint.
type Config struct {
	// Region is the only region requests may be signed for. Default "eu-west-1".
	Region string
	// AccessKey and SecretKey are the only credentials accepted.
	AccessKey, SecretKey string
	// Transition is how long stopping and pending last. Default 0: immediate.
	Transition time.Duration
	// MaxSkew bounds the difference between X-Amz-Date and the endpoint's clock. Default 5 min.
	MaxSkew time.Duration
	// Log receives request lines. Default: discarded.
	Log *slog.Logger
}

type instance struct {
	id, name string
	state    string
	until    time.Time // when stopping/pending ends
	fault    Fault
	reads    int
}

// Sim is one running endpoint.
type Sim struct {
	cfg Config
	ln  net.Listener
	srv *http.Server

	mu        sync.Mutex
	instances map[string]*instance
	order     []string
	next      int
	hl        *hanglistener.Listener
	calls     []string
}

// Start starts the endpoint on a free port of 127.0.0.1 (plain HTTP; the SDK's endpoint override
// points at it).
func Start(cfg Config) (*Sim, error) {
	if cfg.Region == "" {
		cfg.Region = "eu-west-1"
	}
	if cfg.MaxSkew == 0 {
		cfg.MaxSkew = 5 * time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Sim{cfg: cfg, ln: ln, instances: map[string]*instance{}}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	s.hl = hanglistener.New(ln)
	go func() { _ = s.srv.Serve(s.hl) }()
	return s, nil
}

// Endpoint is the base URL to give the SDK, http://127.0.0.1:port.
func (s *Sim) Endpoint() string { return "http://" + s.ln.Addr().String() }

// Region is the region requests must be signed for.
func (s *Sim) Region() string { return s.cfg.Region }

// Close stops the endpoint.
func (s *Sim) Close() error {
	s.hl.CloseHung()
	return s.srv.Close()
}

// AddInstance adds a running instance tagged Name=name and returns its id.
func (s *Sim) AddInstance(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	id := fmt.Sprintf("i-%017x", 0xfe0000+s.next)
	s.instances[id] = &instance{id: id, name: name, state: "running"}
	s.order = append(s.order, id)
	return id
}

// settle ends a finished transition.
func (in *instance) settle(now time.Time) {
	if in.until.IsZero() || now.Before(in.until) {
		return
	}
	switch in.state {
	case "stopping":
		in.state = "stopped"
	case "pending":
		in.state = "running"
	}
	in.until = time.Time{}
}

// State returns an instance's true state name.
func (s *Sim) State(id string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[id]
	if in == nil {
		return "", fmt.Errorf("ec2sim: no instance %s", id)
	}
	in.settle(time.Now())
	return in.state, nil
}

// SetFault sets an instance's failure mode.
func (s *Sim) SetFault(id string, f Fault) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[id]
	if in == nil {
		return fmt.Errorf("ec2sim: no instance %s", id)
	}
	in.fault = f
	return nil
}

// SetHang makes the endpoint accept new connections and never answer (hang true).
func (s *Sim) SetHang(hang bool) { s.hl.SetHang(hang) }

// Calls returns the actions received with a valid signature, oldest first, as
// "Action InstanceId..." lines ("Force=true" appended when given).
func (s *Sim) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// apiError is an EC2 error.
type apiError struct {
	status        int
	code, message string
}

func writeError(w http.ResponseWriter, e apiError) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(e.status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>%s</RequestID></Response>`,
		xmlEscape(e.code), xmlEscape(e.message), requestID())
}

func xmlEscape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

var reqSeq struct {
	sync.Mutex
	n int
}

func requestID() string {
	reqSeq.Lock()
	defer reqSeq.Unlock()
	reqSeq.n++
	return fmt.Sprintf("7f2b1c3e-0000-4000-8000-%012d", reqSeq.n)
}

// ServeHTTP handles one Query API request.
func (s *Sim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, apiError{400, "InvalidRequest", "cannot read the request body"})
		return
	}
	if e := s.verify(r, body); e != nil {
		s.cfg.Log.Debug("ec2 request refused", "code", e.code, "msg", e.message)
		writeError(w, *e)
		return
	}
	form, err := url.ParseQuery(string(body))
	if r.Method != http.MethodPost || err != nil {
		writeError(w, apiError{400, "InvalidRequest", "expected a POST with a form-encoded body"})
		return
	}
	if v := form.Get("Version"); v != "2016-11-15" {
		writeError(w, apiError{400, "InvalidParameterValue", "unsupported API version " + strconv.Quote(v)})
		return
	}
	ids := indexed(form, "InstanceId")
	action := form.Get("Action")
	call := strings.TrimSpace(action + " " + strings.Join(ids, " "))
	if form.Get("Force") == "true" {
		call += " Force=true"
	}
	s.mu.Lock()
	s.calls = append(s.calls, call)
	s.mu.Unlock()
	var out any
	var e *apiError
	switch action {
	case "DescribeInstances":
		out, e = s.describe(ids, filters(form))
	case "StopInstances":
		out, e = s.change(ids, false)
	case "StartInstances":
		out, e = s.change(ids, true)
	default:
		e = &apiError{400, "InvalidAction", "The action " + action + " is not valid for this web service."}
	}
	if e != nil {
		writeError(w, *e)
		return
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_, _ = io.WriteString(w, xml.Header)
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	_ = enc.Encode(out)
}

// indexed returns the values of prefix.1, prefix.2, ... in order.
func indexed(form url.Values, prefix string) []string {
	var out []string
	for i := 1; ; i++ {
		v, ok := form[prefix+"."+strconv.Itoa(i)]
		if !ok {
			return out
		}
		out = append(out, v...)
	}
}

// filters returns Filter.N.Name -> values.
func filters(form url.Values) map[string][]string {
	out := map[string][]string{}
	for i := 1; ; i++ {
		name := form.Get("Filter." + strconv.Itoa(i) + ".Name")
		if name == "" {
			return out
		}
		out[name] = indexed(form, "Filter."+strconv.Itoa(i)+".Value")
	}
}

type stateXML struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type tagXML struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type instanceXML struct {
	InstanceID    string   `xml:"instanceId"`
	ImageID       string   `xml:"imageId"`
	InstanceState stateXML `xml:"instanceState"`
	InstanceType  string   `xml:"instanceType"`
	PrivateIP     string   `xml:"privateIpAddress"`
	TagSet        []tagXML `xml:"tagSet>item"`
}

type reservationXML struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []instanceXML `xml:"instancesSet>item"`
}

type describeXML struct {
	XMLName      xml.Name         `xml:"DescribeInstancesResponse"`
	Xmlns        string           `xml:"xmlns,attr"`
	RequestID    string           `xml:"requestId"`
	Reservations []reservationXML `xml:"reservationSet>item"`
}

type changeItemXML struct {
	InstanceID    string   `xml:"instanceId"`
	CurrentState  stateXML `xml:"currentState"`
	PreviousState stateXML `xml:"previousState"`
}

type changeXML struct {
	XMLName   xml.Name
	Xmlns     string          `xml:"xmlns,attr"`
	RequestID string          `xml:"requestId"`
	Instances []changeItemXML `xml:"instancesSet>item"`
}

func state(name string) stateXML { return stateXML{stateCodes[name], name} }

func (s *Sim) lookup(ids []string) ([]*instance, *apiError) {
	var out, missing []string
	for _, id := range ids {
		if !strings.HasPrefix(id, "i-") || len(id) < 10 {
			return nil, &apiError{400, "InvalidInstanceID.Malformed", fmt.Sprintf("Invalid id: %q", id)}
		}
		if s.instances[id] == nil {
			missing = append(missing, id)
		}
		out = append(out, id)
	}
	if len(missing) > 0 {
		return nil, &apiError{400, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance IDs '%s' do not exist", strings.Join(missing, ", "))}
	}
	ins := make([]*instance, len(out))
	for i, id := range out {
		ins[i] = s.instances[id]
	}
	return ins, nil
}

func (s *Sim) describe(ids []string, f map[string][]string) (any, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range f {
		if name != "instance-id" && name != "instance-state-name" && !strings.HasPrefix(name, "tag:") {
			return nil, &apiError{400, "InvalidParameterValue", "The filter '" + name + "' is invalid"}
		}
	}
	var sel []*instance
	if len(ids) > 0 {
		var e *apiError
		if sel, e = s.lookup(ids); e != nil {
			return nil, e
		}
	} else {
		for _, id := range s.order {
			sel = append(sel, s.instances[id])
		}
	}
	now := time.Now()
	out := describeXML{Xmlns: Namespace, RequestID: requestID(), Reservations: []reservationXML{}}
	for _, in := range sel {
		in.settle(now)
		name := in.state
		if in.fault == FaultFlapping {
			name = []string{"running", "stopped"}[in.reads%2]
			in.reads++
		}
		if v, ok := f["instance-id"]; ok && !slices.Contains(v, in.id) {
			continue
		}
		if v, ok := f["instance-state-name"]; ok && !slices.Contains(v, name) {
			continue
		}
		if v, ok := f["tag:Name"]; ok && !slices.Contains(v, in.name) {
			continue
		}
		out.Reservations = append(out.Reservations, reservationXML{
			ReservationID: "r-" + in.id[2:], OwnerID: "123456789012",
			Instances: []instanceXML{{InstanceID: in.id, ImageID: "ami-0abcdef1234567890", InstanceState: state(name),
				InstanceType: "m5.metal", PrivateIP: "10.0.0." + strconv.Itoa(len(out.Reservations)+10),
				TagSet: []tagXML{{"Name", in.name}}}},
		})
	}
	sort.SliceStable(out.Reservations, func(i, j int) bool { return out.Reservations[i].ReservationID < out.Reservations[j].ReservationID })
	return out, nil
}

func (s *Sim) change(ids []string, start bool) (any, *apiError) {
	if len(ids) == 0 {
		return nil, &apiError{400, "MissingParameter", "The request must contain the parameter InstanceId"}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ins, e := s.lookup(ids)
	if e != nil {
		return nil, e
	}
	now := time.Now()
	name := "StopInstancesResponse"
	if start {
		name = "StartInstancesResponse"
	}
	out := changeXML{XMLName: xml.Name{Local: name}, Xmlns: Namespace, RequestID: requestID()}
	for _, in := range ins {
		in.settle(now)
		prev := in.state
		switch {
		case in.fault == FaultAPIError:
			return nil, &apiError{400, "IncorrectInstanceState", fmt.Sprintf("The instance '%s' is not in a state from which it can be %s.", in.id, map[bool]string{true: "started", false: "stopped"}[start])}
		case in.fault == FaultStuck:
		case start && prev == "stopped":
			in.state, in.until = "pending", now.Add(s.cfg.Transition)
		case start && prev == "stopping":
			return nil, &apiError{400, "IncorrectInstanceState", fmt.Sprintf("The instance '%s' is not in a state from which it can be started.", in.id)}
		case !start && (prev == "running" || prev == "stopping"):
			in.state, in.until = "stopping", now.Add(s.cfg.Transition)
		case !start && prev == "pending":
			return nil, &apiError{400, "IncorrectInstanceState", fmt.Sprintf("The instance '%s' is not in a state from which it can be stopped.", in.id)}
		}
		in.settle(now)
		out.Instances = append(out.Instances, changeItemXML{InstanceID: in.id, CurrentState: state(in.state), PreviousState: state(prev)})
	}
	return out, nil
}

// verify checks the request's SigV4 signature; nil means valid.
func (s *Sim) verify(r *http.Request, body []byte) *apiError {
	auth := r.Header.Get("Authorization")
	const algo = "AWS4-HMAC-SHA256"
	if !strings.HasPrefix(auth, algo+" ") {
		return &apiError{401, "AuthFailure", "AWS was not able to validate the provided access credentials"}
	}
	parts := map[string]string{}
	for _, kv := range strings.Split(strings.TrimPrefix(auth, algo+" "), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		parts[k] = v
	}
	cred := strings.Split(parts["Credential"], "/")
	if len(cred) != 5 || cred[4] != "aws4_request" {
		return &apiError{400, "IncompleteSignature", "the Credential of the Authorization header is malformed"}
	}
	if s.cfg.AccessKey == "" || s.cfg.SecretKey == "" || cred[0] != s.cfg.AccessKey {
		return &apiError{401, "AuthFailure", "AWS was not able to validate the provided access credentials"}
	}
	if cred[2] != s.cfg.Region || cred[3] != "ec2" {
		return &apiError{401, "AuthFailure", fmt.Sprintf("Credential should be scoped to a valid region and service ec2, not '%s/%s'", cred[2], cred[3])}
	}
	amzDate := r.Header.Get("X-Amz-Date")
	t, err := time.Parse("20060102T150405Z", amzDate)
	if err != nil || !strings.HasPrefix(amzDate, cred[1]) {
		return &apiError{400, "IncompleteSignature", "X-Amz-Date is missing or does not match the credential scope"}
	}
	if d := time.Since(t); d > s.cfg.MaxSkew || d < -s.cfg.MaxSkew {
		return &apiError{400, "RequestExpired", "Request has expired"}
	}
	signed := strings.Split(parts["SignedHeaders"], ";")
	if !slices.Contains(signed, "host") || !slices.Contains(signed, "x-amz-date") {
		return &apiError{400, "IncompleteSignature", "host and x-amz-date must be signed"}
	}
	payloadHash := sha256.Sum256(body)
	payload := hex.EncodeToString(payloadHash[:])
	if h := r.Header.Get("X-Amz-Content-Sha256"); h != "" && h != payload {
		return &apiError{400, "XAmzContentSHA256Mismatch", "The provided x-amz-content-sha256 header does not match what was computed."}
	}
	var canon strings.Builder
	canon.WriteString(r.Method + "\n")
	canon.WriteString(canonicalPath(r.URL.EscapedPath()) + "\n")
	canon.WriteString(canonicalQuery(r.URL.Query()) + "\n")
	for _, h := range signed {
		canon.WriteString(h + ":" + headerValue(r, h) + "\n")
	}
	canon.WriteString("\n" + parts["SignedHeaders"] + "\n" + payload)
	crHash := sha256.Sum256([]byte(canon.String()))
	scope := strings.Join(cred[1:], "/")
	toSign := algo + "\n" + amzDate + "\n" + scope + "\n" + hex.EncodeToString(crHash[:])
	key := hmacSHA256([]byte("AWS4"+s.cfg.SecretKey), cred[1])
	key = hmacSHA256(key, cred[2])
	key = hmacSHA256(key, cred[3])
	key = hmacSHA256(key, "aws4_request")
	want := hex.EncodeToString(hmacSHA256(key, toSign))
	if !hmac.Equal([]byte(want), []byte(parts["Signature"])) {
		return &apiError{401, "AuthFailure", "AWS was not able to validate the provided access credentials"}
	}
	return nil
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

func canonicalPath(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

func canonicalQuery(q url.Values) string {
	var pairs []string
	for k, vs := range q {
		for _, v := range vs {
			pairs = append(pairs, awsEscape(k)+"="+awsEscape(v))
		}
	}
	sort.Strings(pairs)
	return strings.Join(pairs, "&")
}

// awsEscape percent-encodes everything but the unreserved characters.
func awsEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// headerValue is a signed header's canonical value: trimmed, inner spaces collapsed, repeated
// headers joined by commas.
func headerValue(r *http.Request, name string) string {
	var vals []string
	switch name {
	case "host":
		vals = []string{r.Host}
	case "content-length":
		vals = []string{strconv.FormatInt(r.ContentLength, 10)}
	default:
		vals = r.Header.Values(name)
	}
	for i, v := range vals {
		vals[i] = strings.Join(strings.Fields(v), " ")
	}
	return strings.Join(vals, ",")
}
