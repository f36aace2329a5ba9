package cluster

import (
	"time"

	"github.com/nodefence/nodefence/testbed/ipmisim"
)

// powerPoll is how often the supply checks its BMC for a power request. A chassis command waits
// for it, so it bounds the latency the BMC adds.
const powerPoll = 20 * time.Millisecond

// supply is the node's power supply: it applies the power requests of the node's BMC (which has
// an external supply, see ipmisim.SetExternalPower) to the node. Power off returns only once every
// process of the node is dead, so the BMC never reads off while the node still runs. Power on
// answers at once and boots the node in the background, as a real machine reports power on
// long before its operating system is up.
func (n *Node) supply(stop <-chan struct{}) {
	t := time.NewTicker(powerPoll)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		req, err := n.BMC.PendingPower()
		if err != nil {
			n.c.log.Error("BMC power request", "node", n.Name, "err", err)
			continue
		}
		switch req {
		case ipmisim.RequestNone:
			continue
		case ipmisim.RequestOff:
			if err := n.powerOff(); err != nil {
				continue // the request times out: the BMC answers the power-off with an error
			}
			n.complete(false)
		case ipmisim.RequestOn:
			n.complete(true)
			go n.powerOn()
		case ipmisim.RequestReset:
			if err := n.powerOff(); err != nil {
				continue
			}
			n.complete(true)
			go n.powerOn()
		}
	}
}

func (n *Node) complete(on bool) {
	if err := n.BMC.CompletePower(on); err != nil {
		n.c.log.Error("BMC power state", "node", n.Name, "err", err)
	}
}
