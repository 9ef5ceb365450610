// parse-asyncapi.mjs parses an AsyncAPI document with the AsyncAPI
// project's own parser and prints its diagnostics, one JSON object a
// line; it exits 1 on any error or warning (severity 0 or 1), or if the
// parser gives no document.
//
//   node parse-asyncapi.mjs ../../docs/asyncapi.json
import {readFileSync} from "node:fs";
import {Parser} from "@asyncapi/parser";

const {document, diagnostics} = await new Parser().parse(
  readFileSync(process.argv[2], "utf8"));
let failed = !document;
for (const d of diagnostics) {
  console.log(JSON.stringify({severity: d.severity, code: d.code,
    message: d.message, path: d.path}));
  failed ||= d.severity <= 1;
}
process.exit(failed ? 1 : 0);
