// One `execute` through the official TypeScript SDK client (npm @modelcontextprotocol/sdk),
// with its default options: what a TypeScript MCP host does. Prints one JSON line per event
// (`connected`, then `answer` or `error`) so the Python test can read what the client saw.
//
// usage: node lost_execute.mjs <server url> <api key> <code>
// The SDK's folder comes from LOCKGATE_TS_SDK (the tests install it from the registry).
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [url, apiKey, code] = process.argv.slice(2);
const sdk = process.env.LOCKGATE_TS_SDK;
const load = (part) => import(pathToFileURL(join(sdk, "dist", "esm", part)).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");

const say = (event) => process.stdout.write(JSON.stringify(event) + "\n");
const started = Date.now();
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${apiKey}` } },
});
const client = new Client({ name: "lockgate-ts-test", version: "1.0.0" });
client.onerror = (error) => process.stderr.write(`client error: ${error}\n`);
await client.connect(transport);
say({ event: "connected", sessionId: transport.sessionId, protocolVersion: transport.protocolVersion });
try {
  const result = await client.callTool({ name: "execute", arguments: { code } });
  say({ event: "answer", elapsedMs: Date.now() - started, result });
} catch (error) {
  say({
    event: "error",
    elapsedMs: Date.now() - started,
    code: error.code ?? null,
    message: String(error.message ?? error),
    data: error.data ?? null,
  });
}
try {
  await transport.terminateSession();
} catch {
  // the server may be gone again; the answer above is what the test reads
}
await client.close();
process.exit(0);
