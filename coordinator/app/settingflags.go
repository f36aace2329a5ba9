package app

import (
	"flag"
	"reflect"
	"sync"

	coordv1 "github.com/nodefence/nodefence/proto/nodefence/coordinator/v1"
)

// funcFlags are the flags RegisterFlags binds with fs.Func (they parse into their field): the
// field each one sets, since a function has no address to match.
var funcFlags = map[string]string{
	"etcd-endpoints":      "EtcdEndpoints",
	"driver-endpoint":     "DriverEndpoints",
	"driver-identity":     "DriverIdentities",
	"kubelet-down-policy": "Engine.KubeletDownPolicy",
	"unhealthy-condition": "Engine.UnhealthyConditions",
	"fence-mode":          "Engine.Fence.Mode",
	"fence-detect":        "Engine.Fence.Detect",
}

// settingFlags maps a setting's field path ("Engine.NodeMonitorGracePeriod") to the flag that
// sets it ("node-monitor-grace-period"), so that GetConfig names the flags an operator types. It
// registers the flags on a fresh Config and matches each flag's variable to the field at the same
// address.
var settingFlags = sync.OnceValue(func() map[string]string {
	var c Config
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	c.RegisterFlags(fs)
	byAddr := map[uintptr]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if v := reflect.ValueOf(f.Value); v.Kind() == reflect.Pointer {
			byAddr[v.Pointer()] = f.Name
		}
	})
	out := map[string]string{}
	var walk func(v reflect.Value, prefix string)
	walk = func(v reflect.Value, prefix string) {
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			fv := v.Field(i)
			if fv.Kind() == reflect.Struct {
				walk(fv, prefix+f.Name+".")
				continue
			}
			if name, ok := byAddr[fv.Addr().Pointer()]; ok {
				out[prefix+f.Name] = name
			}
		}
	}
	walk(reflect.ValueOf(&c).Elem(), "")
	for name, path := range funcFlags {
		out[path] = name
	}
	return out
})

// nameFlags fills each setting's flag.
func nameFlags(settings []*coordv1.Setting) []*coordv1.Setting {
	flags := settingFlags()
	for _, s := range settings {
		s.Flag = flags[s.Name]
	}
	return settings
}
