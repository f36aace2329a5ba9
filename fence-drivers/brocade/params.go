package brocade

import (
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/services/fault"
)

// config is a parsed target.
type config struct {
	host, port string
	username   string
	password   string
	plug       int
	ssh        bool
	prompt     string
	idFile     string     // SSH identity file, read by withSession for every login
	signer     ssh.Signer // from idFile
	hostKeys   ssh.HostKeyCallback
	policy     string // host key policy, for the session key
}

func (c *config) addr() string { return net.JoinHostPort(c.host, c.port) }

// parse reads canonical parameters, naming every bad one, and prepares the host key check.
func (d *Driver) parse(p map[string]string) (*config, error) {
	var inv fault.Invalid
	c := &config{host: strings.TrimSpace(p[kit.ParamIP]), username: p[kit.ParamUsername], password: p[kit.ParamPassword],
		ssh: p[ParamSSH] == "1", prompt: p[ParamCommandPrompt]}
	if c.host == "" || strings.ContainsAny(c.host, " /") {
		inv.Add(kit.ParamIP, "must be an IP address or hostname, got %q", c.host)
	}
	c.port = strings.TrimSpace(p[kit.ParamIPPort])
	if c.port == "" {
		c.port = "23"
		if c.ssh {
			c.port = "22"
		}
	}
	if n, err := strconv.Atoi(c.port); err != nil || n < 1 || n > 65535 {
		inv.Add(kit.ParamIPPort, "must be a TCP port 1-65535, got %q", c.port)
	}
	if strings.TrimSpace(c.username) == "" {
		inv.Add(kit.ParamUsername, "required: switch login name")
	}
	if n, err := strconv.Atoi(strings.TrimSpace(p[kit.ParamPlug])); err != nil || n < 0 {
		inv.Add(kit.ParamPlug, "must be a port index (0, 1, ...), got %q", p[kit.ParamPlug])
	} else {
		c.plug = n
	}
	if strings.TrimSpace(c.prompt) == "" {
		inv.Add(ParamCommandPrompt, "must not be empty")
	}
	idFile := strings.TrimSpace(p[ParamIdentityFile])
	c.idFile = idFile
	switch {
	case !c.ssh && c.password == "":
		inv.Add(kit.ParamPassword, "required for telnet")
	case !c.ssh && idFile != "":
		inv.Add(ParamIdentityFile, "only for SSH (set ssh=1)")
	case c.ssh && c.password == "" && idFile == "":
		inv.Add(kit.ParamPassword, "required for SSH unless identity_file is given")
	}
	if c.ssh {
		d.parseSSH(p, c, &inv)
	}
	return c, inv.Err()
}

func (d *Driver) parseSSH(p map[string]string, c *config, inv *fault.Invalid) {
	pinned, known, insecure := strings.TrimSpace(p[ParamSSHHostKey]), strings.TrimSpace(p[ParamSSHKnownHosts]), p[ParamSSHInsecure] == "1"
	switch {
	case pinned != "":
		cb, err := pinnedHostKey(pinned)
		if err != nil {
			inv.Add(ParamSSHHostKey, "%v", err)
		}
		c.hostKeys, c.policy = cb, "pinned "+pinned
	case insecure: // explicit, so it wins over the default known_hosts file
		c.hostKeys, c.policy = ssh.InsecureIgnoreHostKey(), "insecure" //nolint:gosec // only with the explicit ssh_insecure=1
	case known != "":
		c.hostKeys, c.policy = acceptNew(known, d.cfg.Log), "known_hosts "+known
	default:
		inv.Add(ParamSSHHostKey, "SSH needs a host key policy: ssh_host_key (pinned), ssh_known_hosts (accept-new) or, for tests only, ssh_insecure=1")
	}
}

// withIdentity returns c with the signer of its SSH identity file, if it names one.
func withIdentity(c *config) (*config, error) {
	if c.idFile == "" {
		return c, nil
	}
	var inv fault.Invalid
	pem, err := os.ReadFile(c.idFile)
	if err != nil {
		inv.Add(ParamIdentityFile, "cannot read: %v", err)
		return nil, inv.Err()
	}
	withKey := *c
	if withKey.signer, err = ssh.ParsePrivateKey(pem); err != nil {
		inv.Add(ParamIdentityFile, "not a usable private key: %v", err)
		return nil, inv.Err()
	}
	return &withKey, nil
}
