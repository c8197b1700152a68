// Calls the app's /generate with Gradio's JavaScript client, once per JSON argument (named
// parameters), and prints what each call gave: test_app.py's JavaScript client test.
import { Client } from "@gradio/client";
const [url, ...calls] = process.argv.slice(2);
const client = await Client.connect(url);
const out = [];
for (const call of calls) {
  try {
    const result = await client.predict("/generate", JSON.parse(call));
    out.push({ok: true, images: result.data[0].length, summary: result.data[1]});
  } catch (e) {
    out.push({ok: false, message: String(e.message ?? e)});
  }
}
console.log(JSON.stringify(out));
process.exit(0);
