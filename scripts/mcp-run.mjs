// mcp-run.mjs — one run_code call through the MCP TypeScript SDK, as an
// independent client of a safe-run HTTP server (make test-service and the
// TLS integration test use it):
//
//   NODE_PATH=<npm-tools>/node_modules NODE_EXTRA_CA_CERTS=ca.pem \
//     node scripts/mcp-run.mjs https://HOST:PORT/mcp TOKEN 'print(6*7)'
//
// It prints the call's text output and exits 0, or prints the error and
// exits 1. NODE_EXTRA_CA_CERTS is how Node trusts a private CA;
// MCP_RUN_ARGS (a JSON object) adds arguments, e.g. {"timeout_seconds": 300}.
import { createRequire } from "node:module";
import path from "node:path";

// NODE_PATH is not consulted by ESM imports; resolve through require.
const require = createRequire(path.join(process.env.NODE_PATH || process.cwd(), "x.js"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

const [url, token, code] = process.argv.slice(2);
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const client = new Client({ name: "mcp-run.mjs", version: "1" });
try {
	await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
	const res = await client.callTool({ name: "run_code", arguments: { language: "python", code, ...JSON.parse(process.env.MCP_RUN_ARGS || "{}") } },
		undefined, { timeout: 15 * 60 * 1000 }); // the SDK's default, 60 s, is shorter than a run may be
	console.log(res.content.filter((c) => c.type === "text").map((c) => c.text).join("\n"));
	await client.close();
	process.exit(res.isError ? 1 : 0);
} catch (e) {
	console.log(String(e && e.cause ? `${e.message}: ${e.cause}` : e));
	process.exit(1);
}
