package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/verdictpdp/verdict/internal/buildinfo"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// runVersion prints the client's version and the server's (from Status's
// verdict-version header), warning when they differ.
func runVersion(ctx context.Context, args []string, e *env) int {
	fs := newFlags("version", e)
	clientOnly := fs.Bool("client", false, "the client's version only; no server call")
	var output outputFlag
	output.register(fs, "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	if stop, code := fs.parseFlags(args); stop {
		return code
	}
	res := map[string]string{"client": buildinfo.Version()}
	code := exitOK
	if !*clientOnly {
		conn, err := cf.dial()
		if err != nil {
			return fail(e, "version", err, nil)
		}
		defer conn.Close()
		cctx, cancel := cf.ctx(ctx)
		var header metadata.MD
		_, err = verdictv1.NewPolicyServiceClient(conn).Status(cctx, &verdictv1.StatusRequest{}, grpc.Header(&header))
		cancel()
		switch v := header.Get(buildinfo.Header); {
		case err != nil:
			fail(e, "version", err, nil)
			res["server"] = "unknown"
			code = exitError
		case len(v) == 0:
			res["server"] = "unknown (a verdictd older than the version header)"
		default:
			res["server"] = v[0]
		}
	}
	err := output.printer(e.stdout).print(res, func(w io.Writer, _ bool) error {
		fmt.Fprintf(w, "client: %s\n", res["client"])
		if s, ok := res["server"]; ok {
			fmt.Fprintf(w, "server: %s\n", s)
		}
		return nil
	})
	if err != nil {
		return fail(e, "version", err, nil)
	}
	if s, ok := res["server"]; ok && code == exitOK && s != res["client"] {
		fmt.Fprintf(e.stderr, "warning: the client and the server are different builds (client %s, server %s)\n", res["client"], s)
	}
	return code
}

// runCompletion prints a shell completion script: commands, and each
// command's flags (read from its flag set).
func runCompletion(args []string, e *env) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
		return runEnv(context.Background(), []string{"help", "completion"}, e)
	}
	if len(args) != 1 || (args[0] != "bash" && args[0] != "zsh" && args[0] != "fish") {
		return usageError(e, "completion", "name the shell: bash, zsh or fish")
	}
	flags := commandFlags()
	var cmds []string
	for _, c := range commands() {
		cmds = append(cmds, c.name)
	}
	sort.Strings(cmds)
	var b strings.Builder
	switch args[0] {
	case "bash", "zsh":
		if args[0] == "zsh" {
			b.WriteString("autoload -U +X bashcompinit && bashcompinit\n")
		}
		b.WriteString("_verdictctl() {\n  local cur=${COMP_WORDS[COMP_CWORD]} cmd=\"\" flags=\"\" w\n")
		b.WriteString("  local i; for ((i=1; i<COMP_CWORD; i++)); do w=${COMP_WORDS[i]}\n")
		b.WriteString("    case \"$w\" in --server|--token-file|--tls-ca|--tls-cert|--tls-key|--tls-server-name|--timeout|-o|--output) i=$((i+1));; -*) ;; *) cmd=$w; break;; esac\n  done\n")
		fmt.Fprintf(&b, "  if [ -z \"$cmd\" ] && [[ $cur != -* ]]; then COMPREPLY=($(compgen -W %q -- \"$cur\")); return; fi\n", strings.Join(cmds, " "))
		b.WriteString("  case \"$cmd\" in\n")
		for _, c := range cmds {
			fmt.Fprintf(&b, "    %s) flags=%q;;\n", c, dashedAll(flags[c]))
		}
		fmt.Fprintf(&b, "    *) flags=%q;;\n  esac\n", "--server --token-file --tls-ca --tls-cert --tls-key --tls-server-name --timeout -o")
		b.WriteString("  if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W \"$flags\" -- \"$cur\")); else COMPREPLY=($(compgen -f -- \"$cur\")); fi\n}\n")
		b.WriteString("complete -o default -F _verdictctl verdictctl\n")
	case "fish":
		fmt.Fprintf(&b, "complete -c verdictctl -f -n __fish_use_subcommand -a %q\n", strings.Join(cmds, " "))
		for _, c := range cmds {
			for _, f := range flags[c] {
				if len(f) == 1 {
					fmt.Fprintf(&b, "complete -c verdictctl -n '__fish_seen_subcommand_from %s' -s %s\n", c, f)
				} else {
					fmt.Fprintf(&b, "complete -c verdictctl -n '__fish_seen_subcommand_from %s' -l %s\n", c, f)
				}
			}
		}
	}
	fmt.Fprint(e.stdout, b.String())
	return exitOK
}

func dashedAll(flags []string) string {
	out := make([]string, len(flags))
	for i, f := range flags {
		out[i] = dashed(f)
	}
	return strings.Join(out, " ")
}

// commandFlags maps each command to its flags, read from its flag set.
func commandFlags() map[string][]string {
	out := map[string][]string{}
	for _, c := range commands() {
		var flags []string
		e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" },
			onFlags: func(fs *flagSet) { fs.VisitAll(func(f *flag.Flag) { flags = append(flags, f.Name) }) }}
		if c.name != "completion" && c.name != "help" {
			c.run(context.Background(), nil, e)
		}
		out[c.name] = flags
	}
	return out
}
