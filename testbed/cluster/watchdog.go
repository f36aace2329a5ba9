package cluster

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/nodefence/nodefence/testbed/watchdogsim"
)

// WatchdogPath is where the node's watchdog device stand-in is while StartWatchdog runs it: the
// file a node agent gets as --watchdog-device.
func (n *Node) WatchdogPath() string { return filepath.Join(n.Dir, "watchdog") }

// StartWatchdog gives the node a watchdog device (testbed/watchdogsim, a FIFO at WatchdogPath:
// every write feeds it, 'V' then close disarms it) with timeout. Armed and unfed for the timeout it
// resets the node: every process of the node dies exactly as at its BMC's power-off, then the node
// boots again as at a power-on (its BMC keeps reading on, as through a hardware reset). Like
// hardware, it survives the node's boots; the node's power-off (BMC power off or reset, or a
// watchdog reset) disarms it. A crash (Crash) does not: an armed watchdog resets a crashed node.
func (n *Node) StartWatchdog(timeout time.Duration) (*watchdogsim.Device, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.wd != nil {
		return nil, fmt.Errorf("%s: has a watchdog", n.Name)
	}
	wd, err := watchdogsim.Start(n.WatchdogPath(), timeout, n.watchdogFired)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.Name, err)
	}
	n.wd = wd
	return wd, nil
}

// Watchdog is the node's watchdog device, or nil.
func (n *Node) Watchdog() *watchdogsim.Device {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.wd
}

// StopWatchdog removes the node's watchdog device, if any: it resets nothing from now on.
func (n *Node) StopWatchdog() {
	n.mu.Lock()
	wd := n.wd
	n.wd = nil
	n.mu.Unlock()
	if wd != nil {
		wd.Stop()
	}
}

// watchdogFired is the device's OnReset, called from its goroutine: the reset runs in a goroutine
// of its own (it waits for the device, see PowerLoss).
func (n *Node) watchdogFired() {
	n.wdReset.Store(true)
	go n.watchdogReset()
}

// watchdogReset is the reset of an unfed watchdog: the BMC's power-off path (every process of the
// node dies), then the power-on path (the node boots), with n.mu held throughout so that no BMC
// request comes in between. A node that lost power since the device fired is not booted: its
// power-off disarmed the device and cancelled the reset.
func (n *Node) watchdogReset() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.wdReset.Swap(false) {
		return
	}
	n.c.log.Warn("watchdog reset", "node", n.Name)
	if err := n.powerOffLocked(); err != nil {
		return // powerOffLocked logged it
	}
	n.powerOnLocked()
}

// watchdogPowerLoss disarms the node's watchdog when the node loses power, and cancels a reset it
// fired before: the device fires only from its own goroutine, which has handled PowerLoss when it
// returns. The caller holds n.mu and has killed the node's processes.
func (n *Node) watchdogPowerLoss() {
	if n.wd != nil {
		n.wd.PowerLoss()
	}
	n.wdReset.Store(false)
}
