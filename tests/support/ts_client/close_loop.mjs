// Sessions opened and closed by the official TypeScript SDK client, `iterations` times:
// connect (initialize), ping, `terminateSession()` (HTTP DELETE), then a raw ping on the
// closed session id, which must be refused (404). Prints one JSON line: how many closes
// were answered, and which closed sessions still served a request.
//
// usage: node close_loop.mjs <server url> <api key> <iterations>
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [url, apiKey, iterations] = process.argv.slice(2);
const sdk = process.env.LOCKGATE_TS_SDK;
const load = (part) => import(pathToFileURL(join(sdk, "dist", "esm", part)).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");

const auth = { Authorization: `Bearer ${apiKey}` };
const revived = [];
let closed = 0;
for (let i = 0; i < Number(iterations); i++) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: auth },
  });
  const client = new Client({ name: "lockgate-ts-close-loop", version: "1.0.0" });
  await client.connect(transport);
  await client.ping();
  const sessionId = transport.sessionId;
  const version = transport.protocolVersion;
  await transport.terminateSession(); // throws unless the DELETE was answered 2xx
  closed += 1;
  const after = await fetch(url, {
    method: "POST",
    headers: {
      ...auth,
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      "Mcp-Session-Id": sessionId,
      "MCP-Protocol-Version": version,
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: 99, method: "ping" }),
  });
  await after.arrayBuffer();
  if (after.status !== 404) revived.push({ iteration: i, sessionId, status: after.status });
  await client.close();
}
process.stdout.write(JSON.stringify({ closed, revived }) + "\n");
process.exit(0);
