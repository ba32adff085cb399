package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/verdictpdp/verdict/internal/buildinfo"
)

// VersionHeader is the response header of Status naming verdictd's build
// (buildinfo.Version): verdictctl version compares it with its own.
const VersionHeader = "verdict-version"

// sendVersion sets the version header of a unary call; a failure (no
// transport stream, as in a direct call) only loses the header.
func sendVersion(ctx context.Context) {
	_ = grpc.SetHeader(ctx, metadata.Pairs(VersionHeader, buildinfo.Version()))
}
