package main

import (
	"context"
	"fmt"
	"regexp"
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
	fs := newFlags("version", "[--client]", "Prints verdictctl's version and the server's; warns on stderr when they differ.", e.stderr)
	clientOnly := fs.Bool("client", false, "the client's version only; no server call")
	var output outputFlag
	output.register(fs, "text", "text", "wide", "json", "yaml")
	var cf connFlags
	cf.register(fs, e.getenv)
	rest, code := parse(fs, args)
	if code != 0 {
		return stopCode(code)
	}
	if len(rest) > 0 {
		fmt.Fprintf(e.stderr, "verdictctl version: unexpected argument %q\n", rest[0])
		return exitUsage
	}
	res := map[string]string{"client": buildinfo.Version()}
	code = exitOK
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
	if output.structured() {
		if err := printValue(e.stdout, output.value, res); err != nil {
			return fail(e, "version", err, nil)
		}
	} else {
		fmt.Fprintf(e.stdout, "client: %s\n", res["client"])
		if s, ok := res["server"]; ok {
			fmt.Fprintf(e.stdout, "server: %s\n", s)
		}
	}
	if s, ok := res["server"]; ok && code == exitOK && s != res["client"] {
		fmt.Fprintf(e.stderr, "warning: the client and the server are different builds (client %s, server %s)\n", res["client"], s)
	}
	return code
}

// runCompletion prints a shell completion script: commands, and each
// command's flags (read from its own -h).
func runCompletion(args []string, e *env) int {
	if len(args) != 1 || (args[0] != "bash" && args[0] != "zsh" && args[0] != "fish") {
		fmt.Fprintln(e.stderr, "Usage: verdictctl completion bash|zsh|fish\n\n"+
			"bash: source <(verdictctl completion bash)\n"+
			"zsh:  source <(verdictctl completion zsh)\n"+
			"fish: verdictctl completion fish | source")
		if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
			return exitOK
		}
		return exitUsage
	}
	flags := commandFlags()
	var cmds []string
	for c := range flags {
		cmds = append(cmds, c)
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
			fmt.Fprintf(&b, "    %s) flags=%q;;\n", c, dashed(flags[c]))
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

func dashed(flags []string) string {
	out := make([]string, len(flags))
	for i, f := range flags {
		if len(f) == 1 {
			out[i] = "-" + f
		} else {
			out[i] = "--" + f
		}
	}
	return strings.Join(out, " ")
}

var flagLine = regexp.MustCompile(`(?m)^  -(\S+)`)

// commandFlags maps each command to its flags, read from its -h.
func commandFlags() map[string][]string {
	out := map[string][]string{"completion": nil}
	for _, c := range []string{"apply", "get", "list", "delete", "status", "decide", "explain", "resolve", "watch", "logs",
		"inspect", "version", "test", "validate", "fmt"} {
		var help strings.Builder
		runEnv(context.Background(), []string{c, "-h"}, &env{stdin: strings.NewReader(""), stdout: &help, stderr: &help,
			getenv: func(string) string { return "" }})
		var flags []string
		for _, m := range flagLine.FindAllStringSubmatch(help.String(), -1) {
			flags = append(flags, m[1])
		}
		out[c] = flags
	}
	return out
}
