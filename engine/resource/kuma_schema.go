package resource

// The schemas of the Kuma policy types whose `default` verdict knows
// (docs/kuma.md, "Typos are refused"). An item of such a type — a from or to
// item, or an item read from a Kuma rule — holds Kuma's `default` as its
// action and conf; a field Kuma's schema does not have is refused with its
// path and the nearest known name, so that a typo never becomes silent
// configuration, and a MeshTrafficPermission item without an action never
// defaults to ALLOW. The conf of every other type stays opaque.
//
// The field names follow Kuma v2.14.3, pkg/plugins/policies/<type>/api/v1alpha1.

import (
	"fmt"
	"maps"
	"slices"
	"sort"
)

// fieldSchema names the fields of an object; a field whose schema is nil
// takes any value (a scalar, a list of scalars, a map of free keys). A list
// of objects is checked item by item against the same schema.
type fieldSchema map[string]fieldSchema

var (
	kumaHeaderKeyValue = fieldSchema{"name": nil, "value": nil}
	kumaHeaderModifier = fieldSchema{"set": kumaHeaderKeyValue, "add": kumaHeaderKeyValue}
	kumaHeaderMatch    = fieldSchema{"type": nil, "name": nil, "value": nil}
	kumaBackOff        = fieldSchema{"baseInterval": nil, "maxInterval": nil}
	kumaRateLimitedOff = fieldSchema{"resetHeaders": fieldSchema{"name": nil, "format": nil}, "maxInterval": nil}
	kumaRate           = fieldSchema{"num": nil, "interval": nil}
	kumaConsecutive    = fieldSchema{"consecutive": nil}
)

// kumaSchemas holds the schema of each known type's `default`.
var kumaSchemas = map[string]fieldSchema{
	"MeshTrafficPermission": {"action": nil},
	"MeshTimeout": {
		"connectionTimeout": nil,
		"idleTimeout":       nil,
		"http": {"requestTimeout": nil, "streamIdleTimeout": nil, "maxStreamDuration": nil,
			"maxConnectionDuration": nil, "requestHeadersTimeout": nil},
	},
	"MeshRetry": {
		"tcp": {"maxConnectAttempt": nil},
		"http": {"numRetries": nil, "perTryTimeout": nil, "backOff": kumaBackOff, "rateLimitedBackOff": kumaRateLimitedOff,
			"retryOn": nil, "retriableResponseHeaders": kumaHeaderMatch, "retriableRequestHeaders": kumaHeaderMatch,
			"hostSelection": {"predicate": nil, "tags": nil, "updateFrequency": nil}, "hostSelectionMaxAttempts": nil},
		"grpc": {"numRetries": nil, "perTryTimeout": nil, "backOff": kumaBackOff, "rateLimitedBackOff": kumaRateLimitedOff,
			"retryOn": nil},
	},
	"MeshRateLimit": {
		"local": {
			"http": {"disabled": nil, "requestRate": kumaRate, "onRateLimit": {"status": nil, "headers": kumaHeaderModifier}},
			"tcp":  {"disabled": nil, "connectionRate": kumaRate},
		},
	},
	"MeshHealthCheck": {
		"interval": nil, "timeout": nil, "unhealthyThreshold": nil, "healthyThreshold": nil, "initialJitter": nil,
		"intervalJitter": nil, "intervalJitterPercent": nil, "healthyPanicThreshold": nil, "failTrafficOnPanic": nil,
		"eventLogPath": nil, "alwaysLogHealthCheckFailures": nil, "noTrafficInterval": nil, "reuseConnection": nil,
		"tcp":  {"disabled": nil, "send": nil, "receive": nil},
		"http": {"disabled": nil, "path": nil, "requestHeadersToAdd": kumaHeaderModifier, "expectedStatuses": nil},
		"grpc": {"disabled": nil, "serviceName": nil, "authority": nil},
	},
	"MeshCircuitBreaker": {
		"connectionLimits": {"maxConnections": nil, "maxConnectionPools": nil, "maxPendingRequests": nil,
			"maxRetries": nil, "maxRequests": nil},
		"outlierDetection": {"disabled": nil, "interval": nil, "baseEjectionTime": nil, "maxEjectionPercent": nil,
			"splitExternalAndLocalErrors": nil, "healthyPanicThreshold": nil,
			"detectors": {"totalFailures": kumaConsecutive, "gatewayFailures": kumaConsecutive,
				"localOriginFailures": kumaConsecutive,
				"successRate":         {"minimumHosts": nil, "requestVolume": nil, "standardDeviationFactor": nil},
				"failurePercentage":   {"minimumHosts": nil, "requestVolume": nil, "threshold": nil}}},
	},
}

// KumaSchemaTypes lists the Kuma policy types whose `default` verdict checks,
// sorted.
func KumaSchemaTypes() []string { return slices.Sorted(maps.Keys(kumaSchemas)) }

// checkKumaItems holds a policy's items to its type's Kuma schema, if verdict
// knows one: every field of an item's conf (Kuma's `default` without its
// action) must be in the schema, and a MeshTrafficPermission item needs an
// action.
func checkKumaItems(o *obj, p *Policy) {
	schema, ok := kumaSchemas[p.Type]
	if !ok {
		return
	}
	for _, list := range []struct {
		key   string
		items []Item
	}{{"from", p.From}, {"to", p.To}} {
		raw, _ := o.m[list.key].([]any)
		for i, it := range list.items {
			path := fmt.Sprintf("%s[%d]", o.field(list.key), i)
			if p.Type == "MeshTrafficPermission" && !hasField(raw, i, "action") {
				o.errs.addStricter(path+".action", "is required for a MeshTrafficPermission item: Allow, Deny or AllowWithShadowDeny", StricterKumaSchema)
			}
			schema.check(o.errs, path+".conf", it.Conf)
		}
	}
}

// check adds an error for every field of v, at any depth, that the schema
// does not name.
func (s fieldSchema) check(errs *FieldErrors, path string, v any) {
	if s == nil {
		return
	}
	switch t := v.(type) {
	case map[string]any:
		keys := slices.Collect(maps.Keys(t))
		sort.Strings(keys)
		for _, k := range keys {
			sub, known := s[k]
			if !known {
				errs.addStricter(JoinPath(path, k), unknownField(k, s), StricterKumaSchema)
				continue
			}
			sub.check(errs, JoinPath(path, k), t[k])
		}
	case []any:
		for i, e := range t {
			s.check(errs, fmt.Sprintf("%s[%d]", path, i), e)
		}
	}
}

func unknownField(k string, s fieldSchema) string {
	reason := "unknown field"
	if near := NearestNames(k, slices.Collect(maps.Keys(s)), 1); len(near) > 0 {
		reason += "; did you mean " + near[0] + "?"
	}
	return reason
}

// hasField reports whether item i of a raw list is an object with field k.
func hasField(raw []any, i int, k string) bool {
	if i >= len(raw) {
		return false
	}
	m, _ := raw[i].(map[string]any)
	_, ok := m[k]
	return ok
}
