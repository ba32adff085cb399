package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/verdictpdp/verdict/internal/buildinfo"
)

// sendVersion sets the version header (buildinfo.Header) of a unary call; a failure (no
// transport stream, as in a direct call) only loses the header.
func sendVersion(ctx context.Context) {
	_ = grpc.SetHeader(ctx, metadata.Pairs(buildinfo.Header, buildinfo.Version()))
}
