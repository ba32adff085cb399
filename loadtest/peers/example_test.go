package peers_test

import (
	"fmt"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/loadtest/peers"
)

// example is one generated-looking rule: every prod service may call svc-7 on
// TCP 8080 or 9000-9100.
var example = &peers.Program{DefaultAction: resource.Deny, Combine: resource.DenyOverrides, Rules: []peers.Rule{{
	Order: 0, Policy: "p-000042-svc-3-to-svc-7", Action: resource.Allow,
	Src:   resource.Selector{Match: map[string]string{resource.ServiceTag: "*", "env": "prod"}},
	Dst:   resource.Selector{Match: map[string]string{resource.ServiceTag: "svc-7"}},
	Ports: []peers.Ports{{Protocol: resource.TCP, Ranges: [][2]uint32{{8080, 8080}, {9000, 9100}}}},
}}}

func ExampleOPARulesModule() {
	src, _ := peers.OPARulesModule(example)
	fmt.Print(src)
	// Output:
	// package verdict
	//
	// default decision := {"action": "DENY", "policy": ""}
	//
	// decision := {"action": m[2], "policy": m[1]} if m := min(match)
	//
	// tag_in(tags, key, values) if tags[key] in values
	//
	// match contains [0, "p-000042-svc-3-to-svc-7", "ALLOW"] if {
	// 	input.source["env"] == "prod"
	// 	input.source["kuma.io/service"]
	// 	input.destination["kuma.io/service"] == "svc-7"
	// 	input.protocol == "TCP"
	// 	input.port == 8080
	// }
	//
	// match contains [0, "p-000042-svc-3-to-svc-7", "ALLOW"] if {
	// 	input.source["env"] == "prod"
	// 	input.source["kuma.io/service"]
	// 	input.destination["kuma.io/service"] == "svc-7"
	// 	input.protocol == "TCP"
	// 	input.port >= 9000
	// 	input.port <= 9100
	// }
}

func ExampleCedarPolicies() {
	src, _ := peers.CedarPolicies(example)
	fmt.Print(src)
	// Output:
	// // p-000042-svc-3-to-svc-7
	// permit (principal, action == Action::"connect", resource)
	// when {
	//   principal.tags has "env" &&
	//   principal.tags["env"] == "prod" &&
	//   principal.tags has "kuma.io/service" &&
	//   resource.tags has "kuma.io/service" &&
	//   resource.tags["kuma.io/service"] == "svc-7" &&
	//   (context.protocol == "TCP" && (context.port == 8080 || (context.port >= 9000 && context.port <= 9100)))
	// };
}
