package kit

// The ClusterLabs fence-agent parameter names shared by several drivers, canonical form (the
// names fence agents read on stdin). A driver describes each with its own aliases, defaults and
// words; the names themselves are written here once.
const (
	// ParamIP is the device's address (alias ipaddr).
	ParamIP = "ip"
	// ParamIPPort is the device's TCP or UDP port.
	ParamIPPort = "ipport"
	// ParamUsername is the login name (alias login).
	ParamUsername = "username"
	// ParamPassword is the login password (alias passwd); a secret.
	ParamPassword = "password"
	// ParamPlug names the outlet, port, system or instance to fence (alias port).
	ParamPlug = "plug"
)
