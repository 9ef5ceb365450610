// validate-frames.mjs validates frames with asyncapi-validator, an
// independent, Ajv-based reading of an AsyncAPI document, and prints one
// verdict a frame, in order, as JSON lines: {"ok": true} or {"ok":
// false, "error": "..."}. Its input, on stdin, is a JSON array of
// {"fromClient": bool, "frame": "..."}: a client's frame is one the
// broker receives on the WebSocket, any other one it sends there (an
// HTTP publish's "accepted" answer, on its own channel).
//
//   node validate-frames.mjs ../../docs/asyncapi.json < frames.json
import AsyncApiValidator from "asyncapi-validator";

const validator = await AsyncApiValidator.fromSource(process.argv[2],
  {msgIdentifier: "name"});
let input = "";
for await (const chunk of process.stdin) input += chunk;
for (const {fromClient, frame} of JSON.parse(input)) {
  try {
    const value = JSON.parse(frame);
    const channel = value?.type === "accepted" ? "topicPublish" : "socket";
    validator.validate(String(value?.type), value, channel,
      fromClient ? "receive" : "send");
    console.log(JSON.stringify({ok: true}));
  } catch (err) {
    console.log(JSON.stringify({ok: false, error: err.message}));
  }
}
