package engine

import (
	"errors"

	"github.com/verdictpdp/verdict/engine/inventory"
	"github.com/verdictpdp/verdict/engine/resource"
)

// Errors the engine returns. Match them with errors.Is.
var (
	// ErrMeshNotFound is returned by Decide and Resolve for a mesh that holds no
	// resource at all (a typo in a mesh name must not fail open).
	ErrMeshNotFound = errors.New("mesh not found")
)

// codeNames is the API status code of each of the engine's errors, by its gRPC
// code name (as google.golang.org/grpc/codes.Code.String spells it: the engine
// imports no gRPC). The first row whose error matches wins.
var codeNames = [...]struct {
	err  error
	name string
}{
	{resource.ErrInvalid, "InvalidArgument"},
	{ErrMeshNotFound, "NotFound"},
	{ErrInvalidStored, "FailedPrecondition"},
	{ErrTypeNotFound, "NotFound"},
	{inventory.ErrIdentityNotFound, "NotFound"},
	{inventory.ErrIdentityCollision, "FailedPrecondition"},
	{inventory.ErrRegistryFull, "ResourceExhausted"},
	{inventory.ErrRegistrationLimit, "ResourceExhausted"},
	{inventory.ErrEndpointNotFound, "NotFound"},
	{inventory.ErrPeerNotAddressable, "FailedPrecondition"},
}

// CodeName returns the status code name the API answers err with when err is
// one of the engine's errors (ok false otherwise). The server's error table
// (server/errors.go) and the suite runner (engine/policytest) both read it, so
// a suite expects exactly the codes the server answers with.
func CodeName(err error) (name string, ok bool) {
	for _, row := range codeNames {
		if errors.Is(err, row.err) {
			return row.name, true
		}
	}
	return "", false
}
