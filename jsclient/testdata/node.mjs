// Runs the suite in Node against the server at process.argv[2], printing
// one JSON line per test. Node 20 needs --experimental-websocket. With
// the folder of the npm packages the tests use as process.argv[3], the
// npm eventsource package (a WHATWG EventSource, which Node lacks) runs
// the suite's Server-Sent Events tests too.
import * as lib from "../popsub.js";
import {run} from "./suite.mjs";

if (process.argv[3]) {
  const {EventSource} = await import(
    process.argv[3] + "/node_modules/eventsource/dist/index.js");
  globalThis.EventSource = EventSource;
}
const results = await run(lib, {base: process.argv[2]});
for (const result of results) console.log(JSON.stringify(result));
process.exit(0);
