// Runs the suite in Node against the server at process.argv[2], printing
// one JSON line per test. Node 20 needs --experimental-websocket.
import * as lib from "../popsub.js";
import {run} from "./suite.mjs";

const results = await run(lib, {base: process.argv[2]});
for (const result of results) console.log(JSON.stringify(result));
process.exit(0);
