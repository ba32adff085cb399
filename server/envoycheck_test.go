package server

import (
	"net/netip"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// CheckRequests built exactly as Envoy builds them, for the tests of Check.
// The reference is Envoy's source/extensions/filters/common/ext_authz/
// check_request_utils.cc (envoyproxy/envoy; a recent version: raw header
// encoding, destination labels for both filters; the functions named below),
// with Network::Utility::addressToProtobufAddress
// (source/common/network/utility.cc) for the addresses. No Envoy binary can
// run here: these builders are the test's Envoy.

// envoyConn is what Envoy knows of a downstream connection.
type envoyConn struct {
	remote, local string // "IP:port" (an IP address) or "unix:PATH" (a pipe)
	// tls: the connection is TLS (connection.ssl() != nullptr). The
	// certificates' fields are read only then.
	tls                    bool
	peerURISANs, peerDNS   []string
	peerSubject            string
	localURISANs, localDNS []string
	localSubject           string
	sni                    string // the TLS SNI (requestedServerName)
}

// envoyFilter is the ext_authz filter's configuration that shapes the
// request (extensions.filters.{http,network}.ext_authz.v3.ExtAuthz).
type envoyFilter struct {
	// labels: the node's bootstrap metadata under bootstrap_metadata_labels_key
	// (read once by the filter's config into destination_labels_).
	labels map[string]string
	// includeTLSSession: include_tls_session.
	includeTLSSession bool
}

// envoyHTTP is one HTTP request as the connection manager hands it to the
// filter: its headers (pseudo-headers included, lower-case keys) and stream.
type envoyHTTP struct {
	streamID      uint64
	protocol      string // Http::Utility::getProtocolString: HTTP/1.0, HTTP/1.1, HTTP/2, HTTP/3
	bytesReceived uint64
	start         time.Time
	headers       map[string]string
	// contextExtensions: the route's (or virtual host's) per-filter
	// ExtAuthzPerRoute.check_settings.context_extensions, merged.
	contextExtensions map[string]string
}

// envoyAddress is addressToProtobufAddress: an IP address becomes a
// socket_address with address and port_value only (protocol is left at its
// zero value, TCP, and ipv4_compat unset); a pipe becomes pipe.path.
func envoyAddress(a string) *corev3.Address {
	if len(a) > 5 && a[:5] == "unix:" {
		return &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: a[5:]}}}
	}
	ap := netip.MustParseAddrPort(a)
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ap.Addr().String(), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(ap.Port())}}}}
}

// envoyPeer is CheckRequestUtils::setAttrContextPeer: the address is the
// connection's remote address for the source, its local address for the
// destination; on a TLS connection the principal is the URI SAN[0] of the
// certificate (the peer's for the source, Envoy's own for the destination),
// else its DNS SAN[0], else its subject; service is set when not empty.
// (include_peer_certificate's certificate is left out: verdict does not
// read it.)
func envoyPeer(c envoyConn, service string, local bool) *authv3.AttributeContext_Peer {
	p := &authv3.AttributeContext_Peer{}
	uri, dns, subject := c.peerURISANs, c.peerDNS, c.peerSubject
	if local {
		p.Address = envoyAddress(c.local)
		uri, dns, subject = c.localURISANs, c.localDNS, c.localSubject
	} else {
		p.Address = envoyAddress(c.remote)
	}
	if c.tls {
		switch {
		case len(uri) > 0:
			p.Principal = uri[0]
		case len(dns) > 0:
			p.Principal = dns[0]
		default:
			p.Principal = subject
		}
	}
	p.Service = service
	return p
}

// envoyTLSSession is CheckRequestUtils::setTLSSession (only with
// include_tls_session): the SNI.
func envoyTLSSession(c envoyConn) *authv3.AttributeContext_TLSSession {
	return &authv3.AttributeContext_TLSSession{Sni: c.sni}
}

// envoyHTTPCheck is CheckRequestUtils::createHttpCheck: source (service from
// the x-envoy-downstream-service-cluster header), destination (no service),
// request (setRequestTime: the stream's start; setHttpRequest: id = the
// stream id, method, path, host (:authority), scheme, size = bytes received,
// protocol, and every header, pseudo-headers included), the TLS session when
// configured, destination.labels = the filter's destination_labels (always
// assigned: an empty map without bootstrap_metadata_labels_key),
// context_extensions, metadata_context and route_metadata_context (always
// set: empty without metadata_context_namespaces).
func envoyHTTPCheck(c envoyConn, f envoyFilter, r envoyHTTP) *authv3.CheckRequest {
	h := r.headers
	a := &authv3.AttributeContext{
		Source:      envoyPeer(c, h["x-envoy-downstream-service-cluster"], false),
		Destination: envoyPeer(c, "", true),
		Request: &authv3.AttributeContext_Request{
			Time: timestamppb.New(r.start),
			Http: &authv3.AttributeContext_HttpRequest{
				Id: strconv.FormatUint(r.streamID, 10), Method: h[":method"], Path: h[":path"], Host: h[":authority"],
				Scheme: h[":scheme"], Size: int64(r.bytesReceived), Protocol: r.protocol, Headers: h,
			},
		},
		ContextExtensions:    r.contextExtensions,
		MetadataContext:      &corev3.Metadata{},
		RouteMetadataContext: &corev3.Metadata{},
	}
	if f.includeTLSSession {
		a.TlsSession = envoyTLSSession(c)
	}
	a.Destination.Labels = f.labels
	return &authv3.CheckRequest{Attributes: a}
}

// envoyTCPCheck is CheckRequestUtils::createTcpCheck (the network filter):
// source and destination only — the destination's service is the
// connection's requestedServerName (the TLS SNI), its labels the filter's
// destination_labels; no request, no context_extensions, no metadata.
func envoyTCPCheck(c envoyConn, f envoyFilter) *authv3.CheckRequest {
	a := &authv3.AttributeContext{
		Source:      envoyPeer(c, "", false),
		Destination: envoyPeer(c, c.sni, true),
	}
	if f.includeTLSSession {
		a.TlsSession = envoyTLSSession(c)
	}
	a.Destination.Labels = f.labels
	return &authv3.CheckRequest{Attributes: a}
}

// envoyRequestHeaders are the headers the HTTP filter sees for a request
// from a client: the pseudo-headers (HTTP/1.1's Host is :authority in
// Envoy's header map), and what the connection manager adds before the
// filters run (x-forwarded-proto, x-request-id), plus extra.
func envoyRequestHeaders(method, authority, path string, extra ...string) map[string]string {
	h := map[string]string{":method": method, ":authority": authority, ":path": path, ":scheme": "http",
		"x-forwarded-proto": "http", "x-request-id": "3f1c2b9e-5d1e-4c55-9a7e-2b8e5f0a1c11", "user-agent": "curl/8.5.0",
		"accept": "*/*"}
	for i := 0; i+1 < len(extra); i += 2 {
		h[extra[i]] = extra[i+1]
	}
	return h
}
