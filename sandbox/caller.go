package sandbox

import "context"

// What the audit log says of a call besides the call itself — which request
// it answered and which program made it — travels in the call's context, as
// the owner does (WithOwner): the edges that know it (the MCP layer, the
// CLI) put it there, and the decorators that record calls (audit.Runner)
// read it there, so that no Runner method needs an argument for it.

// Client is the program making calls, as it names itself: an MCP client's
// clientInfo, or the CLI's own name and version. It is what the client
// claims, never an identity (see WithOwner for that).
type Client struct {
	Name    string
	Version string
}

type clientKey struct{}

// WithClient returns ctx carrying the calling client's name and version.
func WithClient(ctx context.Context, c Client) context.Context {
	return context.WithValue(ctx, clientKey{}, c)
}

// ClientFrom returns the client ctx carries; the zero Client if none.
func ClientFrom(ctx context.Context) Client {
	c, _ := ctx.Value(clientKey{}).(Client)
	return c
}

type requestIDKey struct{}

// WithRequestID returns ctx carrying the id of the request it serves, such
// as an MCP call's JSON-RPC id.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestIDFrom returns the request id ctx carries; "" if none.
func RequestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}
