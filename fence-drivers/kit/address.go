package kit

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodefence/nodefence/services/fault"
)

// ParseAddress reads ParamIP and ParamIPPort from canonical parameters: a host without spaces or
// slashes and a port 1-65535. Problems are added to inv; device ("BMC", "PDU") and transport
// ("UDP", "TCP") word them.
func ParseAddress(p map[string]string, inv *fault.Invalid, device, transport string) (host string, port int) {
	host = strings.TrimSpace(p[ParamIP])
	if host == "" {
		inv.Add(ParamIP, "required: IP address or hostname of the %s", device)
	} else if strings.ContainsAny(host, " /") {
		inv.Add(ParamIP, "%q is not an IP address or hostname", host)
	}
	port, err := strconv.Atoi(p[ParamIPPort])
	if err != nil || port < 1 || port > 65535 {
		inv.Add(ParamIPPort, "must be a %s port 1-65535, got %q", transport, p[ParamIPPort])
		port = 0
	}
	return host, port
}

// addressParams are the canonical parameters that hold a device's address: ip, and ipaddr as
// fence agents (run by the agent driver, which passes names through) may still spell it.
var addressParams = []string{ParamIP, "ipaddr"}

// Resolver looks host names up; net.DefaultResolver in production.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// ResolvedKey is the device key of t with its address written as an IP address: the epoch table,
// the operation table and the device locks key a device by where it really is, so that
// "localhost", "LOCALHOST.", "127.0.0.1" and "::ffff:127.0.0.1" are one device and a second
// spelling cannot bypass the epoch recorded under the first. A literal is written in canonical
// form; a host name is looked up and the lowest of its addresses taken. A name that cannot be
// looked up keeps its own (lower-cased) spelling: no call to it can reach a device either.
func ResolvedKey(ctx context.Context, r Resolver, d Driver, t Target) string {
	resolved := Target{Name: t.Name, Params: maps.Clone(t.Params)}
	changed := false
	for _, p := range addressParams {
		host := strings.TrimSpace(t.Params[p])
		if host == "" {
			continue
		}
		if a, ok := resolveHost(ctx, r, host); ok {
			resolved.Params[p], changed = a.String(), true
		}
	}
	if !changed {
		return d.DeviceKey(t)
	}
	return d.DeviceKey(resolved) // Parsed is nil: a driver keying by its parsed form parses again
}

func resolveHost(ctx context.Context, r Resolver, host string) (netip.Addr, bool) {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if r == nil {
		return netip.Addr{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := r.LookupNetIP(ctx, "ip", strings.ToLower(strings.TrimSuffix(host, ".")))
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}, false
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap().WithZone("")
	}
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	return addrs[0], true
}
