package main

// Flags: the standard library's flag package, which reads -name and --name
// alike (docs/cli.md, "Why no CLI library"), with verdictctl's own help,
// errors and suggestions around it.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
)

// flagSet is one command's flags.
type flagSet struct {
	*flag.FlagSet
	cmd   *command
	e     *env
	short map[string]string // a long flag's one-letter alias: output → o
	conn  map[string]bool   // the connection flags, listed apart in the help
}

// newFlags makes the flag set of a command of the table.
func newFlags(name string, e *env) *flagSet {
	c := lookup(name)
	if c == nil { // tests make flag sets of their own
		c = &command{name: name}
	}
	fs := &flagSet{FlagSet: flag.NewFlagSet("verdictctl "+name, flag.ContinueOnError), cmd: c, e: e,
		short: map[string]string{}, conn: map[string]bool{}}
	fs.SetOutput(io.Discard) // errors and help are printed here, not by package flag
	fs.Usage = func() {}
	return fs
}

// parse reads the flags anywhere among args and returns the other arguments.
// When stop is true the command ends at once with code: help was printed
// (0), or a flag was wrong (2, with a short error, a suggestion and a hint).
func (fs *flagSet) parse(args []string) (rest []string, stop bool, code int) {
	if fs.e.onFlags != nil {
		fs.e.onFlags(fs)
		return nil, true, exitOK
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.help(fs.e.stdout)
				return nil, true, exitOK
			}
			return nil, true, fs.flagError(err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return rest, false, exitOK
		}
		if args[0] == "--" {
			return append(rest, args[1:]...), false, exitOK
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
}

// parseFlags is parse for a command that takes flags only: an argument is a
// usage error. When stop is true the command ends at once with code.
func (fs *flagSet) parseFlags(args []string) (stop bool, code int) {
	rest, stop, code := fs.parse(args)
	if stop {
		return true, code
	}
	if len(rest) > 0 {
		return true, fs.usage("unexpected argument %q", rest[0])
	}
	return false, exitOK
}

// usage prints a usage error of the command (exit 2).
func (fs *flagSet) usage(format string, a ...any) int {
	return usageError(fs.e, fs.cmd.name, fmt.Sprintf(format, a...))
}

var (
	undefinedFlag = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	badValue      = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-+([^:]+): (.*)$`)
	needsArg      = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
)

// flagError turns package flag's error into verdictctl's: one line naming
// the flag as the docs write it, a "did you mean" for an unknown one, and
// the hint line.
func (fs *flagSet) flagError(err error) int {
	msg := err.Error()
	if m := undefinedFlag.FindStringSubmatch(msg); m != nil {
		fmt.Fprintf(fs.e.stderr, "verdictctl %s: unknown flag %s\n", fs.cmd.name, dashed(m[1]))
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if s := suggest(m[1], names); len(s) > 0 {
			for i := range s {
				s[i] = dashed(s[i])
			}
			fmt.Fprintf(fs.e.stderr, "Did you mean %s?\n", strings.Join(s, " or "))
		}
		fmt.Fprintf(fs.e.stderr, "Run 'verdictctl %s --help' for usage.\n", fs.cmd.name)
		return exitUsage
	}
	if m := badValue.FindStringSubmatch(msg); m != nil {
		why := m[3]
		if strings.HasPrefix(why, "parse error") || strings.HasPrefix(why, "strconv.") {
			why = "not a " + fs.kind(m[2])
		}
		return fs.usage("%s %s: %s", dashed(m[2]), m[1], why)
	}
	if m := needsArg.FindStringSubmatch(msg); m != nil {
		return fs.usage("%s needs a value", dashed(m[1]))
	}
	return fs.usage("%s", msg)
}

// kind names what a flag's value must be, for an error.
func (fs *flagSet) kind(name string) string {
	f := fs.Lookup(name)
	if f == nil {
		return "valid value"
	}
	switch placeholder(f) {
	case "N":
		return "number"
	case "DURATION":
		return "duration (30s, 2m)"
	}
	return "valid value"
}

// dashed is a flag as the docs write it: -o, --dst.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// alias makes short a one-letter alias of the long flag (already defined):
// the help lists them together.
func (fs *flagSet) alias(long, short string) {
	f := fs.Lookup(long)
	fs.Var(f.Value, short, f.Usage)
	fs.short[long] = short
}

// placeholder is the value's name in the help: the usage's `QUOTED` word,
// else one by the flag's type.
func placeholder(f *flag.Flag) string {
	name, _ := flag.UnquoteUsage(f)
	switch name {
	case "":
		return ""
	case "value", "string":
		return "VALUE"
	case "uint", "int", "uint64", "int64":
		return "N"
	case "duration":
		return "DURATION"
	}
	return name
}

// help prints the command's help: synopsis, about, examples, flags.
func (fs *flagSet) help(w io.Writer) {
	c := fs.cmd
	fmt.Fprintf(w, "Usage: verdictctl %s %s\n", c.name, strings.TrimSpace(c.args+" [flags]"))
	if c.about != "" {
		fmt.Fprintf(w, "\n%s\n", c.about)
	}
	if len(c.examples) > 0 {
		fmt.Fprintln(w, "\nExamples:")
		for _, ex := range c.examples {
			fmt.Fprintf(w, "  %s\n", ex)
		}
	}
	aliases := map[string]bool{}
	for _, s := range fs.short {
		aliases[s] = true
	}
	var own, conn []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		switch {
		case aliases[f.Name]:
		case fs.conn[f.Name]:
			conn = append(conn, f)
		default:
			own = append(own, f)
		}
	})
	if len(own) > 0 {
		fmt.Fprintln(w, "\nFlags:")
		fs.printFlags(w, own)
	}
	if len(conn) > 0 {
		fmt.Fprintln(w, "\nConnection flags (before or after the command):")
		fs.printFlags(w, conn)
	}
	fmt.Fprintln(w, "\nExit codes: 0 yes or done, 1 the answer is no, 2 usage, 3 a server or I/O error (docs/cli.md).")
}

func (fs *flagSet) printFlags(w io.Writer, flags []*flag.Flag) {
	sort.Slice(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, f := range flags {
		name := "    " + dashed(f.Name)
		if len(f.Name) == 1 {
			name = dashed(f.Name)
		}
		if s, ok := fs.short[f.Name]; ok {
			name = "-" + s + ", " + dashed(f.Name)
		}
		if p := placeholder(f); p != "" {
			name += " " + p
		}
		_, usage := flag.UnquoteUsage(f)
		if d := f.DefValue; d != "" && d != "false" && d != "0" && !strings.Contains(usage, "default") {
			usage += fmt.Sprintf(" (default %s)", d)
		}
		fmt.Fprintf(tw, "  %s\t%s\n", name, usage)
	}
	tw.Flush()
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
