// Types of the rusting-brain package (the wasm-bindgen declarations, with the option
// and result objects spelled out).

export type Device = 'webgpu' | 'cpu';

export interface LoadOptions {
  /** "auto" (default): WebGPU where the browser has an adapter, else the CPU. */
  device?: 'auto' | 'webgpu' | 'cpu';
}

export interface GenerateOptions {
  /** Most new tokens (default 64). */
  maxTokens?: number;
  /** 0 (default) is greedy; above 0, sampling from softmax(logits / temperature). */
  temperature?: number;
  /** Keep only the k most likely tokens (0 or absent: all). */
  topK?: number;
  /** Keep the smallest set of tokens whose probability reaches p, in (0, 1]. */
  topP?: number;
  /** Divides positive logits and multiplies negative ones of tokens already in the context (1: off). */
  repetitionPenalty?: number;
  /** The sampler's seed (an integer up to 2^53 - 1); the same seed gives the same ids on every device. Random when absent. */
  seed?: number;
  /** Stop at the tokenizer's `<|end|>` token (default true). */
  stopAtEnd?: boolean;
  /** Aborting it stops the generation after the current token, like `model.stop()`. */
  signal?: AbortSignal;
}

export interface GenerateResult {
  text: string;
  ids: Uint32Array;
  promptTokens: number;
  tokens: number;
  /** From the call to the first new token: prompt encoding, prefill and the first draw. */
  firstTokenMs: number;
  totalMs: number;
  /** Tokens after the first, per second of decoding. */
  tokensPerSecond: number;
  device: Device;
  finish: 'length' | 'end' | 'stopped' | 'max_seq_len';
}

export interface ModelInfo {
  vocabSize: number;
  dModel: number;
  nLayers: number;
  maxSeqLen: number;
  parameters: number;
  experts: number;
}

/** Called with each new token's text (empty while a character is incomplete) and id; return false to stop. */
export type OnToken = (text: string, id: number) => boolean | void;

export class Model {
  private constructor();
  static load(weights: Uint8Array, tokenizerJson: string, options?: LoadOptions): Promise<Model>;
  device(): Device;
  deviceReason(): string;
  info(): ModelInfo;
  encode(text: string): Uint32Array;
  decode(ids: Uint32Array | number[]): string;
  /** A continuation of `prompt`, from a fresh conversation. */
  generate(prompt: string, options?: GenerateOptions, onToken?: OnToken): Promise<GenerateResult>;
  /** A continuation of the conversation so far (the KV cache keeps earlier turns). */
  chat(text: string, options?: GenerateOptions, onToken?: OnToken): Promise<GenerateResult>;
  /** Ends a running generation after its current token. */
  stop(): void;
  /** Forgets the conversation. */
  reset(): void;
  /** Frees the model's memory, GPU buffers included. */
  dispose(): void;
  free(): void;
}

export function initialize(wasm?: string | URL | Response | BufferSource | WebAssembly.Module): Promise<void>;
export function loadModel(weights: Uint8Array | ArrayBuffer | ArrayBufferView, tokenizerJson: string, options?: LoadOptions): Promise<Model>;
export function fetchModel(weightsUrl: string | URL, tokenizerUrl: string | URL, options?: LoadOptions): Promise<Model>;
