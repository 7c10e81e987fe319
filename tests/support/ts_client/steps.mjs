// A sequence of MCP calls through the official TypeScript SDK client (npm
// @modelcontextprotocol/sdk), on a new session or on an existing one: what a TypeScript MCP
// host does across a server restart. Prints one JSON line per step (`connected`, then one
// `answer` or `error` per call) so the Python test can read what the client saw. The
// session is left open (not terminated) unless the last argument is `close`.
//
// usage: node steps.mjs <server url> <api key> <session id or -> <calls as JSON> [close]
//   calls: [{"tool": "execute", "arguments": {...}} | {"method": "tools/list"}, ...]
// The SDK's folder comes from LOCKGATE_TS_SDK (the tests install it from the registry).
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [url, apiKey, sessionId, callsJson, close] = process.argv.slice(2);
const sdk = process.env.LOCKGATE_TS_SDK;
const load = (part) => import(pathToFileURL(join(sdk, "dist", "esm", part)).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");

const say = (event) => process.stdout.write(JSON.stringify(event) + "\n");
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${apiKey}` } },
  // An existing session: the SDK then skips initialize and sends its id.
  ...(sessionId !== "-" ? { sessionId } : {}),
});
const client = new Client({ name: "lockgate-ts-steps", version: "1.0.0" });
client.onerror = (error) => process.stderr.write(`client error: ${error}\n`);
await client.connect(transport);
say({ event: "connected", sessionId: transport.sessionId });
for (const call of JSON.parse(callsJson)) {
  try {
    const result =
      call.method === "tools/list"
        ? await client.listTools()
        : await client.callTool({ name: call.tool, arguments: call.arguments });
    say({ event: "answer", result });
  } catch (error) {
    say({ event: "error", code: error.code ?? null, message: String(error.message ?? error) });
  }
}
if (close === "close") {
  await transport.terminateSession();
}
await client.close();
process.exit(0);
