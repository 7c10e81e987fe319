// MCP 2025-11-25's tasks through the official TypeScript SDK client's experimental tasks API
// (npm @modelcontextprotocol/sdk, `client.experimental.tasks`), as a TypeScript host drives
// them: one step per run, so a test can kill the server between two. Prints one JSON line
// per event the client saw.
//
// usage: node tasks_2025.mjs <server url> <api key> <step> <JSON argument>
//   create  {"tool", "arguments"}  tools/call with `task`: prints the CreateTaskResult
//   stream  {"tool", "arguments"}  callToolStream: every message until the result
//   result  {"taskId"}             tasks/result: answers the person's prompt (accept), prints
//                                  each prompt and the result
//   list    {}                     tasks/list, and tasks/get of the newest
//   cancel  {"taskId"}             tasks/cancel
// The SDK's folder comes from LOCKGATE_TS_SDK (the tests install it from the registry).
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const [url, apiKey, step, argumentJson] = process.argv.slice(2);
const argument = JSON.parse(argumentJson);
const sdk = process.env.LOCKGATE_TS_SDK;
const load = (part) => import(pathToFileURL(join(sdk, "dist", "esm", part)).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");
const { ElicitRequestSchema, CreateTaskResultSchema, CallToolResultSchema } = await load("types.js");

const say = (event) => process.stdout.write(JSON.stringify(event) + "\n");
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${apiKey}` } },
});
const client = new Client(
  { name: "lockgate-ts-tasks", version: "1.0.0" },
  { capabilities: { elicitation: { form: {} } } },
);
client.onerror = (error) => process.stderr.write(`client error: ${error}\n`);
// The client's person: shown each prompt, accepts it.
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  say({ event: "prompt", params: request.params });
  return { action: "accept", content: {} };
});
try {
  await client.connect(transport);
  say({ event: "connected", capabilities: client.getServerCapabilities() });
  const tasks = client.experimental.tasks;
  if (step === "create") {
    await client.listTools(); // what the SDK learns taskSupport from
    const created = await client.request(
      { method: "tools/call", params: { ...argument, task: { ttl: 60000 } } },
      CreateTaskResultSchema,
    );
    say({ event: "created", result: created });
  } else if (step === "stream") {
    await client.listTools();
    for await (const message of tasks.callToolStream(argument)) {
      say({ event: message.type, message });
    }
  } else if (step === "result") {
    say({ event: "result", result: await tasks.getTaskResult(argument.taskId, CallToolResultSchema) });
  } else if (step === "list") {
    const listed = await tasks.listTasks();
    say({ event: "listed", result: listed });
    say({ event: "task", result: await tasks.getTask(listed.tasks[0].taskId) });
  } else if (step === "cancel") {
    say({ event: "cancelled", result: await tasks.cancelTask(argument.taskId) });
  }
} catch (error) {
  say({ event: "error", code: error.code ?? null, message: String(error.message ?? error) });
}
await client.close();
process.exit(0);
