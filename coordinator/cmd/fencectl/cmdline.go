package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/nodefence/nodefence/services/buildinfo"
	"github.com/nodefence/nodefence/services/tlsfiles"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1   // the command ran and failed (a refused call, a fence in error)
	exitUsage       = 2   // the command line is wrong: nothing was sent
	exitInterrupted = 130 // Ctrl-C (128 + SIGINT, as shells report it)
)

// ctl is one invocation: the global flags, where output goes, and the coordinator connection.
type ctl struct {
	addrs    string
	tls      tlsfiles.Files
	timeout  time.Duration
	perAddr  time.Duration
	output   string
	json     bool // deprecated alias of -o json
	version  bool
	context  string // --context: the settings file's context to use
	out, err io.Writer

	// getenv reads the environment (os.Getenv; tests give their own).
	getenv func(string) string
	// fset and given are this invocation's parsed flags and the names of those on the command
	// line; contextUsed and settingsFrom say which context applySettings used and where each
	// setting came from (flag, an environment variable, the context).
	fset         *flag.FlagSet
	given        map[string]bool
	contextUsed  string
	settingsFrom map[string]string

	interrupted func() bool // reports whether the operator pressed Ctrl-C
	conn        *grpc.ClientConn
	addr        string
	addrList    []string
	refused     *refusal // why conn's server was refused, for "cannot connect" (client.go)
}

// globalFlags binds the flags every command accepts, anywhere on the line.
func (c *ctl) globalFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("fencectl", flag.ContinueOnError)
	fs.StringVar(&c.addrs, "coordinator", "127.0.0.1:7001", "coordinator address(es), comma-separated; the leader is found by itself")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "overall deadline of a command that calls the coordinator")
	fs.DurationVar(&c.perAddr, "per-address-timeout", 10*time.Second, "deadline of each coordinator address (a call, or reaching it for a watch)")
	fs.StringVar(&c.output, "o", "table", "output format: table, json or yaml")
	fs.StringVar(&c.output, "output", "table", "output format: table, json or yaml (same as -o)")
	fs.BoolVar(&c.json, "json", false, "DEPRECATED: use -o json")
	fs.BoolVar(&c.version, "version", false, "print fencectl's version and exit")
	fs.StringVar(&c.context, "context", "", "the settings file's context to use instead of its current-context (env "+envContext+")")
	c.tls.RegisterFlags(fs, "", "the coordinator connection")
	for _, name := range settingNames {
		fs.Lookup(name).Usage += " (env " + envName(name) + ")"
	}
	return fs
}

// usageError is a mistake on the command line: exit 2, nothing sent.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// interruptedError reports a watch the operator stopped with Ctrl-C: the fence goes on.
type interruptedError struct{ msg string }

func (e interruptedError) Error() string { return e.msg }

// run is fencectl with its arguments and the process's environment; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runEnv(ctx, args, stdout, stderr, os.Getenv)
}

// runEnv is run with the environment read through getenv.
func runEnv(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	root := ctx
	c := &ctl{out: stdout, err: stderr, getenv: getenv, interrupted: func() bool { return root.Err() != nil }}
	global := c.globalFlags()
	name, rest, help, err := splitCommand(global, args)
	if err != nil {
		fmt.Fprintf(stderr, "fencectl: %v (see fencectl help)\n", err)
		return exitUsage
	}
	if name == "" {
		switch {
		case help:
			printUsage(stdout, global)
			return exitOK
		case slices.ContainsFunc(args, func(a string) bool { return a == "-version" || a == "--version" }):
			fmt.Fprintln(stdout, buildinfo.String("fencectl"))
			return exitOK
		}
		printUsage(stderr, global)
		fmt.Fprintln(stderr, "\nfencectl: COMMAND: missing")
		return exitUsage
	}
	cmd := lookup(name)
	if cmd == nil {
		return unknownCommand(stdout, stderr, name, rest, help)
	}
	fs, runner := cmd.flagSet(global)
	pos, err := parseInterleaved(fs, rest)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printCommandHelp(stdout, cmd, global)
		return exitOK
	case err != nil:
		msg := err.Error()
		if f, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
			var names []string
			fs.VisitAll(func(fl *flag.Flag) { names = append(names, fl.Name) })
			msg = "unknown flag " + f + didYouMean(strings.TrimLeft(f, "-"), names)
		}
		fmt.Fprintf(stderr, "fencectl %s: %s (see fencectl help %s)\n", cmd.name, msg, cmd.name)
		return exitUsage
	}
	if c.version {
		fmt.Fprintln(stdout, buildinfo.String("fencectl"))
		return exitOK
	}
	c.fset, c.given = fs, map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.given[f.Name] = true })
	if !cmd.offline {
		if err := c.applySettings(fs, c.given); err != nil {
			fmt.Fprintf(stderr, "fencectl %s: %v\n", cmd.name, err)
			return exitUsage
		}
	}
	if err := c.checkOutput(fs, cmd); err != nil {
		fmt.Fprintf(stderr, "fencectl %s: %v\n", cmd.name, err)
		return exitUsage
	}
	if len(pos) < cmd.minArgs || len(pos) > cmd.maxArgs {
		fmt.Fprintf(stderr, "fencectl %s: want %s, got %d argument(s) (see fencectl help %s)\n", cmd.name, argsWord(cmd), len(pos), cmd.name)
		return exitUsage
	}
	if !cmd.offline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
		defer func() {
			if c.conn != nil {
				c.conn.Close()
			}
		}()
	}
	return c.exit(cmd, runner(ctx, c, pos))
}

// unknownCommand answers a name that is no command: a group's help, the group's subcommands, or
// what the user may have meant.
func unknownCommand(stdout, stderr io.Writer, name string, rest []string, help bool) int {
	subs := groupCommands(name)
	switch {
	case len(subs) > 0 && (help || slices.ContainsFunc(rest, isHelpFlag)):
		printGroupHelp(stdout, name)
		return exitOK
	case len(subs) > 0:
		fmt.Fprintf(stderr, "fencectl %s: want a subcommand: %s (see fencectl help %s)\n", name, strings.Join(subs, ", "), name)
	default:
		fmt.Fprintf(stderr, "fencectl: unknown command %q%s (see fencectl help)\n", name, suggestCommand(name))
	}
	return exitUsage
}

// exit prints err and returns the exit code it means.
func (c *ctl) exit(cmd *command, err error) int {
	var usageErr usageError
	var intr interruptedError
	var code exitCode
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &usageErr):
		fmt.Fprintf(c.err, "fencectl %s: %v\n", cmd.name, err)
		return exitUsage
	case errors.As(err, &intr):
		fmt.Fprintf(c.err, "fencectl: %v\n", err)
		return exitInterrupted
	case errors.As(err, &code):
		return int(code)
	}
	if s, ok := status.FromError(err); ok {
		fmt.Fprintf(c.err, "fencectl %s: %s: %s\n", cmd.name, s.Code(), s.Message())
	} else {
		fmt.Fprintf(c.err, "fencectl %s: %v\n", cmd.name, err)
	}
	return exitFailed
}

// exitCode ends a command with a code, its message already printed.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// splitCommand finds the command in args: its name (one word, or two for a command group such as
// "config show"), and every other argument in order. Global flags may come before it; help reports
// -h or --help among them.
func splitCommand(global *flag.FlagSet, args []string) (name string, rest []string, help bool, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if len(a) > 1 && a[0] == '-' {
			fname, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if fname == "h" || fname == "help" {
				help = true
				continue
			}
			f := global.Lookup(fname)
			if f == nil {
				return "", nil, false, fmt.Errorf("unknown flag %s before the command (a command's own flags go after it)", a)
			}
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) {
				i++
			}
			continue
		}
		name = a
		after := args[i+1:]
		if group := groupOf(a); group && len(after) > 0 && !strings.HasPrefix(after[0], "-") {
			name, after = a+" "+after[0], after[1:]
		}
		rest = append(append(rest, args[:i]...), after...)
		return name, rest, help, nil
	}
	return "", nil, help, nil
}

// parseInterleaved parses flags and positional arguments in any order; "--" ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		if len(args) > fs.NArg() && args[len(args)-fs.NArg()-1] == "--" {
			return append(pos, fs.Args()...), nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// checkOutput refuses an unknown -o, and -o json/yaml for a command that prints only text.
func (c *ctl) checkOutput(fs *flag.FlagSet, cmd *command) error {
	if c.json {
		c.output = "json"
	}
	switch c.output {
	case "table", "json", "yaml":
	default:
		return usagef("-o: %q is not one of table, json, yaml", c.output)
	}
	if c.output != "table" && cmd.textOnly {
		return usagef("-o %s: %s prints text only", c.output, cmd.name)
	}
	return nil
}

func argsWord(cmd *command) string {
	if cmd.args == "" {
		return "no arguments"
	}
	return cmd.args
}

// printUsage is fencectl's help: the commands and the global flags.
func printUsage(w io.Writer, global *flag.FlagSet) {
	fmt.Fprint(w, "fencectl: the operator's CLI for the nodefence coordinator.\n\n")
	fmt.Fprint(w, "usage: fencectl COMMAND [ARGS] [flags]    (global flags may go anywhere)\n       fencectl help COMMAND | fencectl COMMAND --help\n\ncommands:\n")
	for _, cmd := range commands {
		fmt.Fprintf(w, "  %s\n      %s\n", synopsis(cmd), cmd.summary)
	}
	fmt.Fprint(w, "\nglobal flags:\n")
	global.SetOutput(w)
	global.PrintDefaults()
	fmt.Fprint(w, settingsHelp)
	fmt.Fprint(w, "\nexit codes: 0 done, 1 failed (a refused call, a fence in error), 2 wrong command line, 130 interrupted\n")
}

// settingsHelp says where the global flags' values come from.
const settingsHelp = `
settings: a flag on the command line wins over its environment variable (NODEFENCE_ and the flag's
name in capitals: NODEFENCE_COORDINATOR, NODEFENCE_TLS_CA, ...), which wins over the context of the
settings file, which wins over the default. The file is $NODEFENCE_CONFIG, else
$XDG_CONFIG_HOME/nodefence/config, else ~/.config/nodefence/config; its current-context is used
unless --context or NODEFENCE_CONTEXT names another. fencectl config set-context NAME --coordinator
ADDR --tls-cert F --tls-key F --tls-ca F writes one; fencectl config view shows what is in force.
`

// suggestCommand is didYouMean for an unknown command: among the table's words, or a group's
// subcommands when the first word is a group.
func suggestCommand(name string) string {
	if group, sub, ok := strings.Cut(name, " "); ok && groupOf(group) {
		return didYouMean(sub, commandNames(group))
	}
	return didYouMean(name, commandNames(""))
}

// printCommandHelp is one command's help: its usage, its own flags, then the global flags.
func printCommandHelp(w io.Writer, cmd *command, global *flag.FlagSet) {
	fmt.Fprintf(w, "usage: fencectl %s [flags]\n\n%s\n", strings.TrimSpace(cmd.name+" "+cmd.args), cmd.summary)
	if cmd.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(cmd.help))
	}
	own := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	if cmd.setup != nil {
		cmd.setup(own)
	}
	own.SetOutput(w)
	n := 0
	own.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprint(w, "\nflags:\n")
		own.PrintDefaults()
	}
	if !cmd.offline {
		fmt.Fprint(w, "\nglobal flags (anywhere on the line):\n")
		global.SetOutput(w)
		global.PrintDefaults()
	}
}

// isHelpFlag reports whether a is -h, -help or --help.
func isHelpFlag(a string) bool { return a == "-h" || a == "-help" || a == "--help" || a == "--h" }

// codeErr turns an exit code whose message is already printed into run's error (nil for 0).
func codeErr(code int) error {
	if code == exitOK {
		return nil
	}
	return exitCode(code)
}

// synopsis is a command with its arguments and its own flags: "list [--node string] [--limit int]".
func synopsis(cmd *command) string {
	parts := []string{cmd.name}
	if cmd.args != "" {
		parts = append(parts, cmd.args)
	}
	own := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	cmd.setup(own)
	own.VisitAll(func(f *flag.Flag) {
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			parts = append(parts, "[--"+f.Name+"]")
			return
		}
		name, _ := flag.UnquoteUsage(f)
		parts = append(parts, "[--"+f.Name+" "+name+"]")
	})
	return strings.Join(parts, " ")
}
