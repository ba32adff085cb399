package apiconv

import (
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/verdictpdp/verdict/engine/resource"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// WorkloadFromProto decodes an API workload by direct field mapping into the
// engine's generic tree, which the one decoder validates; field paths of its
// errors start with path + ".workload".
func WorkloadFromProto(path string, w *verdictv1.Workload) (resource.Resource, error) {
	doc := map[string]any{"kind": "Workload"}
	if w.GetKind() != "" {
		doc["kind"] = w.GetKind()
	}
	setText(doc, "mesh", w.GetMesh())
	setText(doc, "name", w.GetName())
	if t := w.GetTags(); t != nil {
		doc["tags"] = tagTree(t)
	}
	if a := w.GetAddresses(); len(a) > 0 {
		l := make([]any, len(a))
		for i, s := range a {
			l[i] = s
		}
		doc["addresses"] = l
	}
	setText(doc, "principal", w.GetPrincipal())
	if ps := w.GetPorts(); len(ps) > 0 {
		l := make([]any, len(ps))
		for i, p := range ps {
			m := map[string]any{"port": json.Number(strconv.FormatUint(uint64(p.GetPort()), 10))}
			if t := p.GetTags(); t != nil {
				m["tags"] = tagTree(t)
			}
			l[i] = m
		}
		doc["ports"] = l
	}
	setTime(doc, "creationTime", w.GetCreationTime())
	setTime(doc, "modificationTime", w.GetModificationTime())
	r, err := resource.DecodeValue(doc)
	if err != nil {
		if ve := (*resource.ValidationError)(nil); errors.As(err, &ve) {
			return nil, ve.Prefixed(path + ".workload")
		}
		return nil, err
	}
	if _, ok := r.(*resource.Workload); !ok {
		return nil, &resource.ValidationError{Errors: []resource.FieldError{{Field: path + ".workload.kind",
			Reason: "the workload member of a resource holds a Workload"}}}
	}
	return r, nil
}

// WorkloadToProto encodes an engine workload as an API resource.
func WorkloadToProto(w *resource.Workload) *verdictv1.Resource {
	out := &verdictv1.Workload{Kind: "Workload", Mesh: w.Mesh, Name: w.Name, Tags: w.Tags,
		Addresses: w.Addresses, Principal: w.Principal,
		CreationTime: timestamp(w.Meta.CreationTime), ModificationTime: timestamp(w.Meta.ModificationTime)}
	for _, p := range w.Ports {
		out.Ports = append(out.Ports, &verdictv1.WorkloadPort{Port: p.Port, Tags: p.Tags})
	}
	return &verdictv1.Resource{Resource: &verdictv1.Resource_Workload{Workload: out}}
}

func setText(doc map[string]any, key, v string) {
	if v != "" {
		doc[key] = v
	}
}

func setTime(doc map[string]any, key string, t *timestamppb.Timestamp) {
	if t != nil {
		doc[key] = t.AsTime().UTC().Format(time.RFC3339Nano)
	}
}

func tagTree(t map[string]string) map[string]any {
	m := make(map[string]any, len(t))
	for k, v := range t {
		m[k] = v
	}
	return m
}
