package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/nodefence/nodefence/testbed/ipmisim"
)

// supplyPoll is how often a simulated node's supply looks for a power request of its BMC; a chassis
// command waits for it.
const supplyPoll = 20 * time.Millisecond

// followPower is a simulated node's power supply. Its BMC has an external supply
// (ipmisim.SetExternalPower), so every chassis command waits until the supply applied it: no power
// change goes unseen, however short (an off then on 40 ms later is an off, then a boot). off stops
// the node (its agent); on boots it (a new agent with a new boot id). An "on" of a node that is on
// does nothing, as on a real machine: a crashed node whose power stays on stays down until its BMC
// switches it off and on.
func followPower(ctx context.Context, bmc *ipmisim.BMC, off, on func(), log *slog.Logger) {
	t := time.NewTicker(supplyPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		req, err := bmc.PendingPower()
		if err != nil {
			log.Warn("BMC power request", "err", err)
			continue
		}
		powered, err := bmc.Power()
		if err != nil {
			log.Warn("BMC power state", "err", err)
			continue
		}
		switch req {
		case ipmisim.RequestNone:
			continue
		case ipmisim.RequestOff:
			if powered {
				off()
			}
			err = bmc.CompletePower(false)
		case ipmisim.RequestOn:
			err = bmc.CompletePower(true)
			if !powered {
				on()
			}
		case ipmisim.RequestReset:
			if powered {
				off()
			}
			err = bmc.CompletePower(true)
			on()
		}
		if err != nil {
			log.Warn("BMC power state", "err", err)
		}
	}
}

// powerSim follows the simulated node's BMC until ctx ends.
func (c *cluster) powerSim(ctx context.Context, s *sim) {
	followPower(ctx, s.bmc, s.silence, func() {
		s.mu.Lock()
		s.boots++
		s.mu.Unlock()
		if err := c.startSim(s); err != nil {
			c.log.Warn("simulated agent not restarted", "node", s.name, "err", err)
		}
	}, c.log.With("node", s.name))
}
