// Times an exported model under Node with Dawn's WebGPU (the npm package "webgpu"): the same
// model.js a page imports, on the machine's GPU where Chromium cannot be run.
//
//   node bench/export_node.mjs URL DIR RUNS   (URL: the export's directory over HTTP, with
//                                              x.bin: the input as little-endian float32; DIR:
//                                              the same directory on disk, since Node imports
//                                              modules from files only)
// Prints one JSON line: {ms, first, adapter}.
import { pathToFileURL } from "node:url";
import { create, globals } from "webgpu";

Object.assign(globalThis, globals);  // GPUBufferUsage, GPUMapMode, GPUShaderStage...
const [url, dir, runs] = [process.argv[2], process.argv[3], Number(process.argv[4] ?? 20)];
const gpu = create([]);
const adapter = await gpu.requestAdapter({ powerPreference: "high-performance" });
if (!adapter) {
  console.log(JSON.stringify({ error: "Dawn found no WebGPU adapter" }));
  process.exit(0);
}
const { load } = await import(pathToFileURL(dir + "/model.js").href);
const model = await load(url, { adapter });
const x = new Float32Array(await (await fetch(url + "x.bin")).arrayBuffer());
let out = await model.run([x]);
const ts = [];
for (let i = 0; i < runs; i++) {
  const t0 = performance.now();
  out = await model.run([x]);
  ts.push(performance.now() - t0);
}
ts.sort((a, b) => a - b);
const info = adapter.info || {};
console.log(JSON.stringify({
  ms: ts[ts.length >> 1], first: Array.from(out.slice(0, 8)), errors: model.errors,
  adapter: [info.vendor, info.architecture, info.device, info.description].filter((s) => s)
    .join(" "),
}));
process.exit(0);
