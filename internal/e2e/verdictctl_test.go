package e2e

import (
	"strings"
	"testing"
)

// TestVerdictctlTypeTypo: a typo in a policy type is never an answer
// (issue 18, finding 1): decide, explain, resolve and watch rules of an
// unknown type are NotFound with the nearest known type; apply of a policy of
// an unknown type warns on stderr, and a Mesh with strictTypes refuses it.
func TestVerdictctlTypeTypo(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, "--bootstrap", "examples/policies.yaml")
	waitServing(t, d.conn(t))
	env := []string{"VERDICT_SERVER=" + d.addr}
	tests := []struct {
		args  []string
		stdin string
		code  int
		want  []string
	}{
		{args: []string{"decide", "--type", "TraficPermission", "--src", "kuma.io/service=web", "--dst", "kuma.io/service=backend"},
			code: 3, want: []string{"NotFound", `type "TraficPermission" is not known in mesh "default"`, "did you mean TrafficPermission?"}},
		{args: []string{"explain", "--type", "TrafficPermision", "--src", "kuma.io/service=web", "--dst", "kuma.io/service=backend"},
			code: 3, want: []string{"NotFound", "did you mean TrafficPermission?"}},
		{args: []string{"resolve", "--type", "TraficLog", "--src", "kuma.io/service=web", "--dst", "kuma.io/service=backend"},
			code: 3, want: []string{"NotFound", "did you mean TrafficLog?"}},
		{args: []string{"watch", "rules", "--type", "TraficPermission", "--workload", "kuma.io/service=backend"},
			code: 3, want: []string{"NotFound", "did you mean TrafficPermission?"}},
		{args: []string{"apply", "-f", "-"}, stdin: "type: TrafficPermision\nname: typo\nsources: [{}]\ndestinations: [{}]\n",
			code: 0, want: []string{"warning: stdin:1:1: documents[0] (default/policies/TrafficPermision/typo): type \"TrafficPermision\" is neither built in nor declared", "did you mean TrafficPermission?", "created"}},
		{args: []string{"apply", "-f", "-"}, stdin: "kind: Mesh\nname: strict\nstrictTypes: true\ntypes: {Custom: {}}\n---\ntype: Custom\nmesh: strict\nname: ok\nsources: [{}]\ndestinations: [{}]\n",
			code: 0, want: []string{"strict/policies/Custom/ok created"}},
		{args: []string{"apply", "-f", "-"}, stdin: "type: TrafficPermision\nmesh: strict\nname: typo\nsources: [{}]\ndestinations: [{}]\n",
			code: 3, want: []string{"InvalidArgument", "stdin:1:1: documents[0].type: ", "did you mean TrafficPermission?", "strictTypes"}},
	}
	for _, tc := range tests {
		var stdin *strings.Reader
		if tc.stdin != "" {
			stdin = strings.NewReader(tc.stdin)
		}
		var r result
		if stdin != nil {
			r = runTool(t, env, stdin, "verdictctl", tc.args...)
		} else {
			r = runTool(t, env, nil, "verdictctl", tc.args...)
		}
		ok := r.code == tc.code
		for _, w := range tc.want {
			ok = ok && strings.Contains(r.out, w)
		}
		if !ok {
			t.Errorf("verdictctl %s: exit %d, want %d with %q:\n%s", strings.Join(tc.args, " "), r.code, tc.code, tc.want, r.out)
		}
	}
}
