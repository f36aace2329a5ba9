package kit

import (
	"strconv"
	"strings"

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
