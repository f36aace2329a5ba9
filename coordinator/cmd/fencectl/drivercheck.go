package main

import (
	"strings"

	"github.com/nodefence/nodefence/coordinator/fenceconfig"
	"github.com/nodefence/nodefence/fence-drivers/aws"
	"github.com/nodefence/nodefence/fence-drivers/brocade"
	"github.com/nodefence/nodefence/fence-drivers/fenceagent"
	"github.com/nodefence/nodefence/fence-drivers/ipmi"
	"github.com/nodefence/nodefence/fence-drivers/kit"
	"github.com/nodefence/nodefence/fence-drivers/pdu"
	"github.com/nodefence/nodefence/fence-drivers/redfish"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/services/redact"
)

// offlineDrivers are the drivers whose parameters `config check` validates with the drivers' own
// code, by driver name (the names fence-driver --driver takes). The agent driver needs an agent's
// metadata to know its parameters: offline only its allowlist is checked.
var offlineDrivers = map[string]kit.Driver{
	"ipmi": ipmi.New(), "pdu": pdu.New(), "brocade": brocade.New(), "redfish": redfish.New(), "aws": aws.New(),
}

// driverFactories make a fresh driver of each kind offlineDrivers holds, for test --config: a
// check's device sessions are its own and are closed when it ends.
var driverFactories = map[string]func() kit.Driver{
	"ipmi": func() kit.Driver { return ipmi.New() }, "pdu": func() kit.Driver { return pdu.New() },
	"brocade": func() kit.Driver { return brocade.New() }, "redfish": func() kit.Driver { return redfish.New() },
	"aws": func() kit.Driver { return aws.New() },
}

// secretPlaceholder stands in for a secret reference's value, which is read only at call time.
const secretPlaceholder = "secret"

// checkMethod validates a resolved method's parameters as its driver would, without any device:
// canonical names, types, ranges, addresses. It returns the problems, each naming the parameter.
func checkMethod(m fenceconfig.Resolved) []string {
	if m.Driver == "agent" {
		return problems(fenceagent.CheckParameters(m.Parameters, nil))
	}
	d, ok := offlineDrivers[m.Driver]
	if !ok {
		return nil
	}
	canon, err := kit.Canonicalize(placeholderSecrets(m.Parameters), d.Describe())
	if err == nil {
		_, err = d.Parse(canon)
	}
	return problems(err)
}

func problems(err error) []string {
	if err == nil {
		return nil
	}
	msg := strings.TrimPrefix(err.Error(), "invalid: ")
	return strings.Split(msg, "; ")
}

// secretFor reports whether a parameter is secret by the driver's own description (and the kit's
// secret words: pass, community, secret, token, key, kg); secret references show their path.
func secretFor(driver, k string) bool {
	n := kit.NormalizeName(k)
	if redact.Reference(n) {
		return false
	}
	var desc []*driverv1.Parameter
	if d, ok := offlineDrivers[driver]; ok {
		desc = d.Describe()
	}
	return kit.IsSecret(n, desc)
}

// placeholderSecrets is a method's parameters with every secret reference (NAME_file, NAME_secret)
// replaced by NAME with a placeholder value, so a driver can check them without reading a secret.
func placeholderSecrets(in map[string]string) map[string]string {
	params := make(map[string]string, len(in))
	for k, v := range in {
		if base, ok := strings.CutSuffix(k, "_file"); ok {
			k, v = base, secretPlaceholder
		} else if base, ok := strings.CutSuffix(k, "_secret"); ok {
			k, v = base, secretPlaceholder
		}
		params[k] = v
	}
	return params
}
