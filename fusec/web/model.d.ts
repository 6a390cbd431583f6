// Types of model.js, the fusec web runtime written by `Exported.save(dir, target="web")`.

export declare const FORMAT: "fusec-export";
export declare const VERSION: number;

/** float32 -> Float32Array, int32 -> Int32Array, uint32 -> Uint32Array, bool -> Uint8Array,
 *  float16 -> Float16Array where the engine has it, else Uint16Array (the raw bits). */
export type OutputArray = Float32Array | Int32Array | Uint32Array | Uint8Array | Uint16Array;
export type InputValue = ArrayLike<number | boolean> | number | boolean;
/** The exported function's output structure: an array, or arrays (tuples and lists) and
 *  objects (dicts) of them, or null where the function returned None. */
export type Outputs = OutputArray | null | Outputs[] | { [key: string]: Outputs };

export type DType = "float32" | "float16" | "int32" | "uint32" | "bool";

export interface InputSpec {
  /** the input's name: the argument's name, with a path into a pytree such as "params['w']" */
  name: string;
  shape: number[];
  dtype: DType;
  size: number;
  /** false when the program never reads it (it must still be given) */
  used: boolean;
}

export interface OutputSpec {
  shape: number[];
  dtype: DType;
  size: number;
}

export declare class FusecWebError extends Error {}

export declare class Model {
  readonly name: string;
  readonly inputs: InputSpec[];
  readonly outputs: OutputSpec[];
  readonly device: GPUDevice;
  /** the parsed manifest.json */
  readonly manifest: any;
  /** WebGPU errors reported while the model ran (uncaptured errors) */
  readonly errors: string[];
  /** Upload the inputs (by name, or an array in `inputs` order), run every kernel in one
   *  submit and read the outputs back. Calls run one after another. */
  run(inputs: { [name: string]: InputValue } | InputValue[]): Promise<Outputs>;
  /** Release the model's GPU buffers. */
  destroy(): void;
}

export interface LoadOptions {
  adapter?: GPUAdapter;
  device?: GPUDevice;
  /** the GPU object to use instead of navigator.gpu (for example, in Node) */
  gpu?: GPU;
  powerPreference?: GPUPowerPreference;
}

/** Load the export in directory `base` (default: the directory this module is served from):
 *  checks the adapter's features and limits, compiles the kernels and uploads the weights. */
export declare function load(base?: string | URL, options?: LoadOptions): Promise<Model>;

/** The tensors of a safetensors file. */
export declare function readSafetensors(buffer: ArrayBuffer):
  { [name: string]: { dtype: string; shape: number[]; bytes: Uint8Array } };

/** A typed array over a tensor's bytes, in the given fusec dtype. */
export declare function tensorArray(bytes: Uint8Array, dtype: DType): OutputArray;
