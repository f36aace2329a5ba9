package ipmi_test

import (
	"context"
	"testing"
	"time"

	"github.com/nodefence/nodefence/fence-drivers/conformance"
	driverv1 "github.com/nodefence/nodefence/proto/nodefence/driver/v1"
	"github.com/nodefence/nodefence/testbed/ipmisim"
)

// TestConformance runs the driver conformance suite against real ipmi_sim BMCs, checking the
// true state of each with ipmitool.
func TestConformance(t *testing.T) {
	c := serve(t, t.TempDir())
	conformance.Run(t, conformance.Harness{
		Client: c,
		NewDevice: func(t *testing.T, cond conformance.Condition) conformance.Device {
			if cond == conformance.Hanging {
				port, closeHole, err := ipmisim.Blackhole()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(closeHole)
				return conformance.Device{Target: target(port)}
			}
			b := startBMC(t)
			d := conformance.Device{Target: target(b.Port), Power: func(ctx context.Context) (driverv1.PowerState, error) {
				switch got, err := ipmisim.IpmitoolPower(ctx, b.Port, b.User, b.Password); {
				case err != nil:
					return driverv1.PowerState_POWER_STATE_UNKNOWN, err
				case got == "off":
					return stateOff, nil
				default:
					return stateOn, nil
				}
			}}
			switch cond {
			case conformance.Stuck:
				if err := b.SetFault(ipmisim.FaultStuck); err != nil {
					t.Fatal(err)
				}
			case conformance.Flapping:
				if err := b.SetFault(ipmisim.FaultFlap); err != nil {
					t.Fatal(err)
				}
				d.Power = nil // ipmitool would read the flapping answers too
			case conformance.WrongCredentials:
				d.Target = target(b.Port, "password", "S3cr3t-wr0ng")
			case conformance.UnknownPlug:
				d.Target = target(b.Port, "plug", "7")
			}
			return d
		},
		Timeout:   time.Second,
		OKTimeout: 10 * time.Second,
	})
}
