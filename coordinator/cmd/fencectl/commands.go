package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/nodefence/nodefence/services/buildinfo"
)

// runFunc runs a command with its positional arguments; its flags were bound by setup.
type runFunc func(ctx context.Context, c *ctl, args []string) error

// command is one row of fencectl's table of commands.
type command struct {
	// name is the command, one word or a group and a word ("config show").
	name string
	// args is the synopsis of the positional arguments ("NODE").
	args string
	// minArgs and maxArgs bound the positional arguments.
	minArgs, maxArgs int
	// summary is the one line of fencectl help; help, if any, is the rest of fencectl help NAME.
	summary, help string
	// offline commands never call the coordinator, so they need no address or TLS files.
	offline bool
	// textOnly commands print text, not data: -o json and -o yaml are refused.
	textOnly bool
	// setup binds the command's own flags to fs and returns the command.
	setup func(fs *flag.FlagSet) runFunc
}

// commands is fencectl's table of commands, in the order fencectl help lists them.
var commands = []*command{
	{name: "fence", args: "NODE", minArgs: 1, maxArgs: 1, summary: "power a node off, confirmed by read-back, and follow the record",
		help: `Starts (or joins the node's active) fence record on the leader and prints each change of its
progress once. Exit 0 when the record is done, 1 when it ends in error. Ctrl-C stops following only:
the fence continues on the coordinator (fencectl watch ID follows it again). A node that stands
confirmed off (its last fence confirmed it off and neither its agent nor its kubelet has reported
since) is not switched again: fencectl says so and exits 0; --again fences it anyway.
--method watchdog fences with the node's watchdog alone, whether or not its steps list a watchdog
method (the "poison pill"): the leader tells the node's agent to stop feeding its watchdog now and
the record is proven off by time (proof watchdog-timeout) once the node's safe time passed and a
majority of the other agents held the leader's lease; refused for a node whose agent's last report
was not "armed" (docs/watchdog.md).`,
		setup: func(fs *flag.FlagSet) runFunc {
			reason, noWatch := reasonFlag(fs), noWatchFlag(fs)
			again := fs.Bool("again", false, "fence even a node that stands confirmed off (one powered on by hand, outside nodefence)")
			method := fs.String("method", "", `fence with this method alone instead of the node's steps; the one accepted: "watchdog" (stop feeding the node's watchdog, proof by time)`)
			return func(ctx context.Context, c *ctl, a []string) error {
				return c.fence(ctx, a[0], *reason, *method, *noWatch, *again)
			}
		}},
	{name: "unfence", args: "NODE", minArgs: 1, maxArgs: 1, summary: "power a node back on, confirmed by read-back, and follow the record",
		setup: func(fs *flag.FlagSet) runFunc {
			reason, noWatch := reasonFlag(fs), noWatchFlag(fs)
			return func(ctx context.Context, c *ctl, a []string) error { return c.unfence(ctx, a[0], *reason, *noWatch) }
		}},
	{name: "reboot", args: "NODE", minArgs: 1, maxArgs: 1, summary: "power-cycle a node: off, confirmed by read-back, then on, confirmed",
		help: `One record of action reboot (FenceService/Reboot): the power-management methods power the node
off and, only once a power-off is confirmed, on again. A reboot is not a fence: the node's pods are not
released for it. Ctrl-C stops following only: the reboot continues on the coordinator.`,
		setup: func(fs *flag.FlagSet) runFunc {
			reason, noWatch := reasonFlag(fs), noWatchFlag(fs)
			return func(ctx context.Context, c *ctl, a []string) error { return c.reboot(ctx, a[0], *reason, *noWatch) }
		}},
	{name: "ack", args: "NODE", minArgs: 1, maxArgs: 1, summary: "confirm by hand that a node is off (like stonith_admin --confirm)",
		help: `You are the operator your certificate names. A node whose agent or kubelet still reports is
refused unless --force with a --reason.`,
		setup: func(fs *flag.FlagSet) runFunc {
			reason := reasonFlag(fs)
			operator := fs.String("operator", "", "must equal your certificate's operator name if given (who you are comes from the certificate)")
			force := fs.Bool("force", false, "acknowledge although the node's agent or kubelet still reports (needs --reason)")
			return func(ctx context.Context, c *ctl, a []string) error {
				return c.ack(ctx, a[0], *operator, *reason, *force)
			}
		}},
	{name: "get", args: "ID", minArgs: 1, maxArgs: 1, summary: "show one fence record",
		setup: func(*flag.FlagSet) runFunc {
			return func(ctx context.Context, c *ctl, a []string) error { return c.get(ctx, a[0]) }
		}},
	{name: "list", summary: "list fence records, newest first",
		setup: func(fs *flag.FlagSet) runFunc {
			node := fs.String("node", "", "only this node's records")
			st := fs.String("status", "", "only records in this status: new, running, done, error, observed")
			would := fs.Bool("would", false, "only what observe mode would have done: would-fence records, when, and when they would have released the pods (--status observed)")
			limit := fs.Int("limit", 0, "most records per page (0: 100)")
			page := fs.String("page-token", "", "continue a listing where the previous page ended")
			return func(ctx context.Context, c *ctl, _ []string) error {
				if *would {
					if *st != "" && *st != "observed" {
						return usagef("--would lists observed records; it cannot be combined with --status %s", *st)
					}
					return c.listWould(ctx, *node, *limit, *page)
				}
				return c.list(ctx, *node, *st, *limit, *page)
			}
		}},
	{name: "watch", args: "[ID]", maxArgs: 1, summary: "follow a fence record (by ID, or a node's latest) until it is done or in error",
		setup: func(fs *flag.FlagSet) runFunc {
			node := fs.String("node", "", "follow this node's latest record instead of an ID")
			return func(ctx context.Context, c *ctl, a []string) error { return c.watchCommand(ctx, a, *node) }
		}},
	{name: "timeline", args: "NODE", minArgs: 1, maxArgs: 1, summary: "the phases of a node's newest fence: when each happened and what it waited for",
		help: timelineHelp,
		setup: func(*flag.FlagSet) runFunc {
			return func(ctx context.Context, c *ctl, a []string) error { return c.timeline(ctx, a[0]) }
		}},
	{name: "nodes", summary: "list nodes with readiness and last contact",
		setup: func(*flag.FlagSet) runFunc {
			return func(ctx context.Context, c *ctl, _ []string) error { return c.nodes(ctx) }
		}},
	{name: "status", args: "NODE", minArgs: 1, maxArgs: 1, summary: "one node: state, witnesses, last fence, and a check of its fence devices",
		help: `The device check is test NODE's (non-destructive; operators only): a viewer's status shows the
rest and says the check was not allowed.`,
		setup: func(fs *flag.FlagSet) runFunc {
			noCheck := fs.Bool("no-check", false, "do not check the fence devices")
			return func(ctx context.Context, c *ctl, a []string) error { return c.status(ctx, a[0], !*noCheck) }
		}},
	{name: "test", args: "NODE", minArgs: 1, maxArgs: 1, summary: "check a node's fence devices: reachable, credentials good (changes nothing)",
		help: `The leader asks each fence method's driver for Monitor (device reachable, credentials accepted)
and then Status (the power state), never for a power change; the check is in the audit trail. Exit 0
when every device passed, 1 when any did not.

With --config FILE the coordinator is not asked: fencectl checks the node's devices as FILE (not yet
applied) describes them, from this host, with the drivers compiled into it (the same code as
fence-driver), reading the secret files FILE names. Monitor and Status only: nothing is switched.
Methods of the agent driver are not checked this way (it runs fence agents on the driver host).`,
		setup: func(fs *flag.FlagSet) runFunc {
			config := fs.String("config", "", "check the devices of this fence configuration (standalone YAML or ConfigMaps) from here, before it is applied")
			return func(ctx context.Context, c *ctl, a []string) error {
				if *config != "" {
					return c.testConfig(ctx, *config, a[0])
				}
				return c.test(ctx, a[0])
			}
		}},
	{name: "describe", args: "DRIVER", minArgs: 1, maxArgs: 1, offline: true,
		summary: "list a driver's parameters: names, aliases, types, defaults, which are secret",
		help: `The driver's own table, as its Describe RPC returns it (fencectl is built from the same code as
fence-driver). DRIVER is ipmi, pdu, brocade, redfish, aws or agent; the agent driver's parameters
depend on the fence agent: listed are the names any agent may be handed.`,
		setup: func(*flag.FlagSet) runFunc {
			return func(_ context.Context, c *ctl, a []string) error { return c.describe(a[0]) }
		}},
	{name: "zones", summary: "list zones: disruption state and the pod-eviction budget",
		setup: func(*flag.FlagSet) runFunc {
			return func(ctx context.Context, c *ctl, _ []string) error { return c.zones(ctx) }
		}},
	{name: "pause", summary: "pause pod evictions and automatic fencing cluster-wide (manual fences still run)",
		setup: func(fs *flag.FlagSet) runFunc {
			reason := reasonFlag(fs)
			return func(ctx context.Context, c *ctl, _ []string) error { return c.pause(ctx, true, *reason) }
		}},
	{name: "resume", summary: "resume pod evictions and automatic fencing",
		setup: func(*flag.FlagSet) runFunc {
			return func(ctx context.Context, c *ctl, _ []string) error { return c.pause(ctx, false, "") }
		}},
	{name: "leader", summary: "show the leader replica and its epoch",
		setup: func(*flag.FlagSet) runFunc {
			return func(ctx context.Context, c *ctl, _ []string) error { return c.leader(ctx) }
		}},
	{name: "audit", summary: "the coordinator's audit trail: every decision, oldest first",
		setup: func(fs *flag.FlagSet) runFunc {
			node := fs.String("node", "", "only this node's entries")
			limit := fs.Int("limit", 0, "most entries (0: 200)")
			return func(ctx context.Context, c *ctl, _ []string) error { return c.audit(ctx, *node, *limit) }
		}},
	{name: "config show", summary: "the coordinator's live configuration, secrets redacted",
		setup: func(*flag.FlagSet) runFunc {
			return func(ctx context.Context, c *ctl, _ []string) error { return c.configShow(ctx) }
		}},
	{name: "config view", offline: true, summary: "fencectl's own settings in force: each global flag's value and where it comes from",
		help: settingsHelp, setup: viewSetup},
	{name: "config get-contexts", offline: true, summary: "list the contexts of fencectl's settings file, the current one marked *",
		setup: getContextsSetup},
	{name: "config use-context", args: "NAME", minArgs: 1, maxArgs: 1, offline: true,
		summary: "make NAME the settings file's current context", setup: useContextSetup},
	{name: "config set-context", args: "NAME", minArgs: 1, maxArgs: 1, offline: true,
		summary: "write the global flags given on the line into context NAME of the settings file", help: setContextHelp, setup: setContextSetup},
	{name: "config check", args: "PATH", minArgs: 1, maxArgs: 1, offline: true, textOnly: true,
		summary: "validate a fence configuration offline and print each node's plan",
		help: `PATH is a standalone YAML file, or the seed's ConfigMaps (a file or a directory). Beyond the
coordinator's own checks, each method's parameters are checked by its driver's code (compiled into
fencectl; no driver service is asked): unknown names, types, values; and no two nodes may use the
same device (BMC address, PDU outlet, switch port). Secret files (NAME_file) are not touched unless
--check-secrets: then each is read and must hold a value (which is never printed).`,
		setup: func(fs *flag.FlagSet) runFunc {
			secrets := fs.Bool("check-secrets", false, "read every secret file the configuration names (run it where they are: the coordinator's host)")
			return func(_ context.Context, c *ctl, a []string) error {
				return codeErr(configCheck(a[0], *secrets, c.out, c.err))
			}
		}},
	{name: "certs", args: "ROLE/NAME...", maxArgs: 1 << 16, offline: true, textOnly: true,
		summary: "issue a CA and certificates with nodefence identities (offline)", help: certsHelp, setup: certsSetup},
	{name: "version", offline: true, summary: "print fencectl's version (also --version)",
		setup: func(*flag.FlagSet) runFunc {
			return func(_ context.Context, c *ctl, _ []string) error {
				if c.output == "table" {
					_, err := fmt.Fprintln(c.out, buildinfo.String("fencectl"))
					return err
				}
				i := buildinfo.Read()
				return c.show(view{data: object{{"binary", "fencectl"}, {"version", i.Version}, {"revision", i.Revision},
					{"modified", i.Modified}, {"goVersion", i.GoVersion}}})
			}
		}},
}

// help is the last row of the table; it lists the table, so it joins it at init. The maintenance
// group (maintenance.go) follows resume.
func init() {
	at := slices.IndexFunc(commands, func(c *command) bool { return c.name == "resume" }) + 1
	commands = slices.Insert(commands, at, maintenanceCommands...)
	commands = append(commands, &command{name: "help", args: "[COMMAND]", maxArgs: 2, offline: true, textOnly: true, summary: "this help, or a command's",
		setup: func(*flag.FlagSet) runFunc {
			return func(_ context.Context, c *ctl, a []string) error { return c.help(a) }
		}})
}

func reasonFlag(fs *flag.FlagSet) *string {
	return fs.String("reason", "", "reason recorded with the record and in the audit trail")
}

func noWatchFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("no-watch", false, "return once the record is written, without following it")
}

// lookup returns the command called name, or nil.
func lookup(name string) *command {
	for _, cmd := range commands {
		if cmd.name == name {
			return cmd
		}
	}
	return nil
}

// groupOf reports whether word is a command group ("config").
func groupOf(word string) bool { return len(groupCommands(word)) > 0 }

// groupCommands lists the subcommands of a command group.
func groupCommands(group string) []string {
	var out []string
	for _, cmd := range commands {
		if sub, ok := strings.CutPrefix(cmd.name, group+" "); ok {
			out = append(out, sub)
		}
	}
	return out
}

// flagSet returns the flag set of one invocation of cmd: its own flags, and the global ones.
func (cmd *command) flagSet(global *flag.FlagSet) (*flag.FlagSet, runFunc) {
	fs := flag.NewFlagSet("fencectl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	r := cmd.setup(fs)
	global.VisitAll(func(f *flag.Flag) {
		if fs.Lookup(f.Name) == nil {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
	return fs, r
}

// help prints fencectl's help, a command's, or a group's.
func (c *ctl) help(args []string) error {
	global := (&ctl{}).globalFlags()
	if len(args) == 0 {
		printUsage(c.out, global)
		return nil
	}
	name := strings.Join(args, " ")
	if cmd := lookup(name); cmd != nil {
		printCommandHelp(c.out, cmd, global)
		return nil
	}
	if subs := groupCommands(name); len(subs) > 0 {
		printGroupHelp(c.out, name)
		return nil
	}
	return usagef("unknown command %q", name)
}

// printGroupHelp lists the commands of a group.
func printGroupHelp(w io.Writer, group string) {
	fmt.Fprintf(w, "usage: fencectl %s SUBCOMMAND [ARGS] [flags]\n\nsubcommands:\n", group)
	for _, cmd := range commands {
		if strings.HasPrefix(cmd.name, group+" ") {
			fmt.Fprintf(w, "  %-28s %s\n", strings.TrimSpace(cmd.name+" "+cmd.args), cmd.summary)
		}
	}
	if group == "config" {
		fmt.Fprint(w, settingsHelp)
	}
}
