package app

import (
	"flag"
	"reflect"
	"testing"
)

// notSettings are coordinator flags GetConfig has no setting for, with the reason.
var notSettings = map[string]string{}

// Every flag of the coordinator names a setting GetConfig shows (or is listed in notSettings with
// its reason), every flag-bound field is named by exactly one flag, and the flags of a few settings
// are the ones an operator types.
func TestEverySettingNamesItsFlag(t *testing.T) {
	flags := settingFlags()
	byFlag := map[string]string{}
	for path, name := range flags {
		if other, ok := byFlag[name]; ok {
			t.Errorf("flag --%s names two settings: %s and %s", name, other, path)
		}
		byFlag[name] = path
	}
	var c Config
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	c.RegisterFlags(fs)
	shown := map[string]bool{}
	for _, s := range nameFlags(settings(reflect.ValueOf(c), "")) {
		shown[s.Name] = true
		if s.Flag != "" && fs.Lookup(s.Flag) == nil {
			t.Errorf("setting %s names --%s, which the coordinator does not have", s.Name, s.Flag)
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		path, ok := byFlag[f.Name]
		switch {
		case notSettings[f.Name] != "":
		case !ok:
			t.Errorf("flag --%s sets no setting GetConfig shows (a fs.Func flag? add it to funcFlags)", f.Name)
		case !shown[path]:
			t.Errorf("flag --%s sets %s, which GetConfig does not show", f.Name, path)
		}
	})
	for path, want := range map[string]string{
		"FenceOpTimeout": "fence-op-timeout", "Engine.NodeMonitorGracePeriod": "node-monitor-grace-period",
		"Server.TLS.CAFile": "tls-ca", "DriverTLS.CAFile": "driver-tls-ca", "EtcdEndpoints": "etcd-endpoints",
		"Engine.Fence.Enabled": "auto-fence", "Engine.KubeletDownPolicy": "kubelet-down-policy",
	} {
		if flags[path] != want {
			t.Errorf("setting %s: flag %q, want %q", path, flags[path], want)
		}
	}
}
