// fusec web runtime: runs a program exported with `fusec.export(f, ...).save(dir, target="web")`
// on WebGPU. Dependency-free ES module; it reads manifest.json, kernels/*.wgsl and
// weights.safetensors from the directory it is served from (or the URL given to load()).
//
//   import { load } from "./model.js";
//   const model = await load();
//   const out = await model.run({ x: new Float32Array(model.inputs[0].size) });
//
// Every buffer is created once at load; run() uploads the inputs, encodes the exported dispatch
// list into one compute pass and one submit, and reads the outputs back as typed arrays.

export const FORMAT = "fusec-export";
export const VERSION = 1;

/** An error of the exported model (bad input, unsupported adapter, wrong file). */
export class FusecWebError extends Error {
  constructor(message) {
    super(message);
    this.name = "FusecWebError";
  }
}

function fail(message) {
  // also in the page's console: a load error inside an un-awaited promise is easy to miss
  console.error("fusec: " + message);
  throw new FusecWebError(message);
}

const BYTES = { float32: 4, float16: 2, int32: 4, uint32: 4, bool: 4 };

function elementCount(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

function byteSize(spec) {
  // bytes the value occupies on the GPU, rounded up to whole 32-bit words (copies need that)
  return Math.ceil((elementCount(spec.shape) * BYTES[spec.dtype]) / 4) * 4;
}

const ST_TYPES = { F32: Float32Array, F16: Uint16Array, I32: Int32Array, U32: Uint32Array,
                   U8: Uint8Array, BOOL: Uint8Array };

/** The tensors of a safetensors file: {name: {dtype, shape, bytes: Uint8Array}}. */
export function readSafetensors(buffer) {
  const view = new DataView(buffer);
  const n = Number(view.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, n)));
  const out = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const [a, b] = t.data_offsets;
    out[name] = { dtype: t.dtype, shape: t.shape, bytes: new Uint8Array(buffer, 8 + n + a, b - a) };
  }
  return out;
}

/** A typed array over a tensor's bytes in the export's own dtype (see Model.run). */
export function tensorArray(bytes, dtype) {
  const copy = bytes.slice();  // aligned, and independent of the file's buffer
  return fromStorage(copy.buffer, 0, copy.byteLength, dtype);
}

function fromStorage(buffer, offset, nbytes, dtype, count) {
  const n = count ?? nbytes / BYTES[dtype];
  switch (dtype) {
    case "float32": return new Float32Array(buffer, offset, n);
    case "int32": return new Int32Array(buffer, offset, n);
    case "uint32": return new Uint32Array(buffer, offset, n);
    case "bool": return Uint8Array.from(new Uint32Array(buffer, offset, n), (v) => (v ? 1 : 0));
    case "float16":
      return typeof Float16Array === "function" ? new Float16Array(buffer, offset, n)
        : new Uint16Array(buffer, offset, n);  // the raw half-precision bits
    default: fail(`unknown dtype ${dtype}`);
  }
}

const CLASSES = { float32: Float32Array, int32: Int32Array, uint32: Uint32Array };

// An input value as the bytes of its GPU buffer (whole 32-bit words).
function toStorage(value, spec) {
  const n = elementCount(spec.shape);
  let arr = value;
  if (typeof arr === "number" || typeof arr === "boolean") arr = [arr];
  if (!(ArrayBuffer.isView(arr) || Array.isArray(arr))) {
    fail(`input '${spec.name}': expected a typed array or an array of numbers of ` +
         `${n} ${spec.dtype} values (shape [${spec.shape}]); got ${Object.prototype.toString.call(value)}`);
  }
  if (arr.length !== n) {
    fail(`input '${spec.name}': expected ${n} values (${spec.dtype}, shape [${spec.shape}]); ` +
         `got ${arr.length}`);
  }
  let typed;
  if (spec.dtype === "bool") {
    typed = Uint32Array.from(arr, (v) => (v ? 1 : 0));
  } else if (spec.dtype === "float16") {
    if (arr instanceof Uint16Array) typed = arr;  // raw bits
    else if (typeof Float16Array === "function") {
      typed = arr instanceof Float16Array ? arr : Float16Array.from(arr);
    } else {
      fail(`input '${spec.name}' is float16: pass its bits as a Uint16Array (this JavaScript ` +
           "engine has no Float16Array)");
    }
  } else {
    const C = CLASSES[spec.dtype];
    typed = arr instanceof C ? arr : C.from(arr);
  }
  if (typed.byteLength % 4 === 0) return typed;
  const padded = new Uint8Array(Math.ceil(typed.byteLength / 4) * 4);
  padded.set(new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength));
  return padded;
}

function buildTree(tree, leaves) {
  if (tree === 0) return leaves.shift();
  if (tree === null) return null;
  if (tree.tuple) return tree.tuple.map((t) => buildTree(t, leaves));
  if (tree.list) return tree.list.map((t) => buildTree(t, leaves));
  const obj = {};
  for (const [k, t] of tree.dict) obj[k] = buildTree(t, leaves);
  return obj;
}

async function fetchOk(url, how) {
  let r;
  try {
    r = await fetch(url);
  } catch (e) {
    fail(`could not fetch ${url} (${how}): ${e}`);
  }
  if (!r.ok) fail(`could not fetch ${url} (${how}): HTTP ${r.status}`);
  return r;
}

/** Check the adapter's features and limits against what the export needs. */
function checkAdapter(adapter, requires, label) {
  const problems = [];
  for (const f of requires.features) {
    if (!adapter.features.has(f)) {
      problems.push(`feature '${f}'` + (f === "shader-f16" ? " (the program uses float16)" : ""));
    }
  }
  for (const [k, v] of Object.entries(requires.limits)) {
    const have = adapter.limits[k];
    if (have === undefined || have < v) problems.push(`${k} >= ${v} (the adapter offers ${have})`);
  }
  if (problems.length) {
    fail(`the WebGPU adapter${label ? " " + label : ""} is too small for this model; it needs ` +
         problems.join(", "));
  }
}

function adapterLabel(adapter) {
  const i = adapter.info || {};
  const parts = [i.vendor, i.architecture, i.device, i.description].filter((x) => x);
  return parts.length ? `(${parts.join(" ")})` : "";
}

/**
 * Load an exported model.
 * @param {string|URL} [base] the export's directory (default: this module's own)
 * @param {{adapter?: GPUAdapter, device?: GPUDevice, gpu?: GPU,
 *          powerPreference?: GPUPowerPreference}} [options]
 */
export async function load(base, options = {}) {
  const root = new URL(base ?? "./", base ? globalThis.location?.href : import.meta.url);
  if (!root.pathname.endsWith("/")) root.pathname += "/";
  const manifest = await (await fetchOk(new URL("manifest.json", root), "the manifest")).json();
  if (manifest.format !== FORMAT) fail(`${root}manifest.json is not a fusec export`);
  if (manifest.version !== VERSION) {
    fail(`${root} is fusec export format version ${manifest.version}; this module reads ` +
         `version ${VERSION}`);
  }
  let device = options.device;
  if (!device) {
    let adapter = options.adapter;
    if (!adapter) {
      const gpu = options.gpu ?? globalThis.navigator?.gpu;
      if (!gpu) fail("WebGPU is not available here (navigator.gpu is undefined)");
      adapter = await gpu.requestAdapter(
        options.powerPreference ? { powerPreference: options.powerPreference } : undefined);
      if (!adapter) fail("no WebGPU adapter is available (requestAdapter returned null)");
    }
    checkAdapter(adapter, manifest.requires, adapterLabel(adapter));
    device = await adapter.requestDevice({
      requiredFeatures: manifest.requires.features,
      requiredLimits: manifest.requires.limits,
    });
  } else {
    checkAdapter(device, manifest.requires, "");
  }
  const model = new Model(manifest, device, root);
  await model._init();
  return model;
}

/** A loaded export: `run` it with its inputs. */
export class Model {
  constructor(manifest, device, root) {
    this.manifest = manifest;
    this.device = device;
    this.root = root;
    this.name = manifest.name;
    this.inputs = manifest.inputs.map((i) => ({ ...i, size: elementCount(i.shape) }));
    this.outputs = manifest.outputs.map((o) => ({ shape: o.shape, dtype: o.dtype,
                                                   size: elementCount(o.shape) }));
    this._queue = Promise.resolve();  // runs go one after another (they share buffers)
    this.errors = [];
    device.addEventListener?.("uncapturederror", (ev) => {
      this.errors.push(String(ev.error?.message ?? ev.error));
      console.error("fusec: WebGPU error: " + (ev.error?.message ?? ev.error));
    });
  }

  async _init() {
    const m = this.manifest;
    const d = this.device;
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
    this.buffers = m.buffers.map((b, i) => d.createBuffer({ size: b.size, usage,
                                                             label: `${b.role}${i}` }));
    this.zeroed = m.buffers.flatMap((b, i) => (b.zero ? [this.buffers[i]] : []));
    // the weights: uploaded once
    if (m.constants.length) {
      const r = await fetchOk(new URL(m.weights, this.root), "the weights");
      const tensors = readSafetensors(await r.arrayBuffer());
      for (const c of m.constants) {
        const t = tensors[c.tensor];
        if (!t) fail(`${m.weights} has no tensor ${c.tensor}`);
        const want = Math.ceil(elementCount(c.shape) * BYTES[c.dtype]);
        if (t.bytes.byteLength !== want) {
          fail(`tensor ${c.tensor} of ${m.weights} has ${t.bytes.byteLength} bytes; ` +
               `expected ${want}`);
        }
        const data = t.bytes.byteLength % 4 === 0 && t.bytes.byteOffset % 4 === 0 ? t.bytes
          : (() => { const p = new Uint8Array(Math.ceil(want / 4) * 4); p.set(t.bytes); return p; })();
        d.queue.writeBuffer(this.buffers[c.buffer], 0, data.buffer, data.byteOffset,
                            data.byteLength);
      }
    }
    // the kernels: compiled in parallel
    const sources = await Promise.all(m.kernels.map(async (k) =>
      (await fetchOk(new URL(k.file, this.root), `kernel ${k.name}`)).text()));
    d.pushErrorScope("validation");
    this.pipelines = await Promise.all(m.kernels.map(async (k, i) => {
      const module = d.createShaderModule({ code: sources[i], label: k.name });
      const info = module.getCompilationInfo ? await module.getCompilationInfo() : null;
      const errs = info ? info.messages.filter((x) => x.type === "error") : [];
      if (errs.length) {
        fail(`kernel ${k.name} (${k.file}) did not compile: ` +
             errs.map((e) => `${e.lineNum}:${e.linePos} ${e.message}`).join("; "));
      }
      const entries = [];
      for (let b = 0; b < k.n_inputs + k.n_outputs; b++) {
        entries.push({ binding: b, visibility: GPUShaderStage.COMPUTE,
                       buffer: { type: b < k.n_inputs ? "read-only-storage" : "storage" } });
      }
      const bgl = d.createBindGroupLayout({ entries, label: k.name });
      const pipeline = await d.createComputePipelineAsync({
        layout: d.createPipelineLayout({ bindGroupLayouts: [bgl] }),
        compute: { module, entryPoint: "main" }, label: k.name });
      return { pipeline, bgl };
    }));
    // every dispatch binds fixed buffers: its bind group is made once
    this.steps = m.dispatches.map((s) => {
      const { pipeline, bgl } = this.pipelines[s.kernel];
      const bindGroup = d.createBindGroup({ layout: bgl, entries: s.bindings.map((b, i) => (
        { binding: i, resource: { buffer: this.buffers[b] } })) });
      return { pipeline, bindGroup, grid: s.grid };
    });
    const err = await d.popErrorScope();
    if (err) fail(`setting up the model failed: ${err.message}`);
    // one read-back buffer for all the outputs, each at a 4-byte aligned offset
    let offset = 0;
    this.readPlan = m.outputs.map((o) => {
      if (o.buffer === undefined) return { literal: o.literal, dtype: o.dtype };
      const nbytes = byteSize(o);
      const p = { buffer: this.buffers[o.buffer], offset, nbytes, dtype: o.dtype,
                  count: elementCount(o.shape) };
      offset += nbytes;
      return p;
    });
    this.readback = offset ? d.createBuffer({ size: offset, label: "readback",
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST }) : null;
  }

  /**
   * Run the model. `inputs`: {name: TypedArray | number[]} with every input of `model.inputs`
   * (names as the export lists them, such as "x" or "params['w']"), or an array in that order.
   * Resolves to the outputs as typed arrays, in the exported function's output structure.
   */
  run(inputs) {
    const result = this._queue.then(() => this._run(inputs));
    this._queue = result.catch(() => {});
    return result;
  }

  async _run(inputs) {
    const m = this.manifest;
    const d = this.device;
    if (inputs === null || typeof inputs !== "object") {
      fail(`run: expected an object of inputs {${this.inputs.map((i) => i.name).join(", ")}}`);
    }
    const byName = Array.isArray(inputs) ? null : inputs;
    if (byName) {
      const unknown = Object.keys(byName).filter((k) => !this.inputs.some((i) => i.name === k));
      if (unknown.length) {
        fail(`run: unknown input(s) ${unknown.join(", ")}; the inputs are ` +
             this.inputs.map((i) => i.name).join(", "));
      }
    } else if (inputs.length !== this.inputs.length) {
      fail(`run: expected ${this.inputs.length} inputs; got ${inputs.length}`);
    }
    this.inputs.forEach((spec, i) => {
      const v = byName ? byName[spec.name] : inputs[i];
      if (v === undefined) fail(`run: missing input '${spec.name}'`);
      const data = toStorage(v, spec);
      if (spec.used || m.dispatches.length === 0) {
        d.queue.writeBuffer(this.buffers[spec.buffer], 0, data.buffer, data.byteOffset,
                            data.byteLength);
      }
    });
    const enc = d.createCommandEncoder({ label: this.name });
    for (const b of this.zeroed) enc.clearBuffer(b);
    if (this.steps.length) {
      const pass = enc.beginComputePass({ label: this.name });
      for (const s of this.steps) {
        pass.setPipeline(s.pipeline);
        pass.setBindGroup(0, s.bindGroup);
        pass.dispatchWorkgroups(s.grid[0], s.grid[1], s.grid[2]);
      }
      pass.end();
    }
    for (const p of this.readPlan) {
      if (p.buffer) enc.copyBufferToBuffer(p.buffer, 0, this.readback, p.offset, p.nbytes);
    }
    d.queue.submit([enc.finish()]);
    let bytes = null;
    if (this.readback) {
      await this.readback.mapAsync(GPUMapMode.READ);
      bytes = this.readback.getMappedRange().slice(0);
      this.readback.unmap();
    }
    const leaves = this.readPlan.map((p) => {
      if (!p.buffer) return fromStorage(new ArrayBuffer(4), 0, 4, p.dtype, 1).map(() => p.literal);
      return fromStorage(bytes, p.offset, p.nbytes, p.dtype, p.count);
    });
    return buildTree(m.out_tree, leaves);
  }

  /** Release the GPU buffers. */
  destroy() {
    for (const b of this.buffers) b.destroy();
    this.readback?.destroy();
  }
}
