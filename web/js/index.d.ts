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

export type Activation = 'identity' | 'relu' | 'leaky_relu' | 'sigmoid' | 'tanh' | 'softmax';
export type LossName = 'mean_squared_error' | 'binary_cross_entropy' | 'categorical_cross_entropy';

export interface OptimizerOptions {
  /** "adam" (default) or "sgd". */
  kind?: 'adam' | 'sgd';
  /** Default 1e-3. */
  learningRate?: number;
  /** Adam's (beta1, beta2), default [0.9, 0.999]. */
  betas?: [number, number];
  /** Adam's epsilon, default 1e-8. */
  epsilon?: number;
  /** SGD's momentum, default 0. */
  momentum?: number;
  nesterov?: boolean;
  /** Decoupled for Adam (AdamW), L2 for SGD. */
  weightDecay?: number;
}

export interface NetworkSpec {
  inputSize: number;
  layers: { units: number; activation?: Activation; slope?: number }[];
  loss: LossName;
  optimizer?: OptimizerOptions;
  seed?: number;
  device?: 'auto' | 'webgpu' | 'cpu';
}

export interface FitOptions {
  /** Default 10. */
  epochs?: number;
  /** Default 32. */
  batchSize?: number;
  /** Reshuffle the rows before every epoch (default true). */
  shuffle?: boolean;
  /** The shuffling seed; the same seed repeats a native run's order. Random when absent. */
  seed?: number;
}

/** Rows of numbers: an array of rows (arrays or typed arrays), or one flat array of whole rows. */
export type Rows = number[][] | Float32Array[] | Float32Array | Float64Array | number[];

/** The network file native `save_json` writes (format "rusting_brain.network", version 1). */
export interface NetworkFile {
  format: 'rusting_brain.network';
  version: number;
  input_size: number;
  loss: LossName;
  optimizer: { kind: 'adam' | 'sgd'; learning_rate: number; weight_decay: number; momentum?: number; nesterov?: boolean; betas?: [number, number]; epsilon?: number };
  seed: number;
  layers: { units: number; activation: Activation; leaky_slope?: number; weights: number[][]; bias: number[] }[];
}

export interface NetworkInfo {
  inputSize: number;
  outputSize: number;
  layers: { units: number; activation: Activation; slope?: number }[];
  loss: LossName;
  parameters: number;
  seed: number;
}

export class Network {
  private constructor();
  static builder(): NetworkBuilder;
  static create(spec: NetworkSpec): Promise<Network>;
  /** From the file's text or its parsed object (what `toJSON()` returns, or native `save_json` wrote). */
  static fromJSON(file: string | NetworkFile, options?: { device?: 'auto' | 'webgpu' | 'cpu' }): Promise<Network>;
  /** Trains; `onEpoch(epoch, meanLoss)` after each epoch, returning false stops. Resolves to each epoch's mean loss. */
  fit(x: Rows, y: Rows, options?: FitOptions, onEpoch?: (epoch: number, loss: number) => boolean | void): Promise<Float32Array>;
  /** One output row per input row. */
  predict(x: Rows): Promise<Float32Array[]>;
  /** Mean loss, forward only. */
  evaluate(x: Rows, y: Rows): Promise<number>;
  /** Share of rows classified right (argmax; a 0.5 threshold for one output). */
  accuracy(x: Rows, y: Rows): Promise<number>;
  /** The native file format as an object: `JSON.stringify(network)` is a file native `load_json` reads. */
  toJSON(): NetworkFile;
  setLearningRate(learningRate: number): void;
  info(): NetworkInfo;
  device(): Device;
  deviceReason(): string;
  /** Stops a running fit after its current epoch. */
  stop(): void;
  dispose(): void;
  free(): void;
}

export class NetworkBuilder {
  inputSize(n: number): this;
  dense(units: number, activation?: Activation, slope?: number): this;
  loss(name: LossName): this;
  optimizer(options: OptimizerOptions): this;
  seed(n: number): this;
  device(d: 'auto' | 'webgpu' | 'cpu'): this;
  build(): Promise<Network>;
}

/** A byte-level BPE tokenizer (the `language_model` example's kind). */
export class Tokenizer {
  private constructor();
  /** A vocabulary of `vocabSize` (default 512) entries trained on `text`: 256 byte symbols, `<|end|>`, merges. */
  static train(text: string, options?: { vocabSize?: number }): Tokenizer;
  /** From the text of a tokenizer.json, or its parsed object. */
  static fromJSON(file: string | object): Tokenizer;
  encode(text: string): Uint32Array;
  decode(ids: Uint32Array | number[]): string;
  vocabSize(): number;
  endId(): number | undefined;
  /** The tokenizer.json file as an object: `JSON.stringify(tokenizer)` writes it. */
  toJSON(): object;
  free(): void;
}

export interface LmConfig {
  vocabSize: number;
  dModel: number;
  nLayers: number;
  /** Query heads. */
  heads: number;
  /** Key/value heads (default: `heads`). */
  kvHeads?: number;
  headDim: number;
  dFF: number;
  maxSeqLen: number;
  /** Seed of the initialization (default 0): the native builder's weights for the same settings. */
  seed?: number;
  /** Adam: `learningRate` (default 1e-3), `beta1`, `beta2`, `weightDecay`. */
  optimizer?: { learningRate?: number; beta1?: number; beta2?: number; weightDecay?: number };
  /** "auto" (default: WebGPU where there is an adapter), "webgpu" or "cpu". */
  device?: 'auto' | 'webgpu' | 'cpu';
}

export interface LmStep {
  /** Mean loss per token, in nats. */
  loss: number;
  tokens: number;
  /** Global L2 norm of the gradients before clipping. */
  gradNorm: number;
  ms: number;
}

/** A small decoder-only transformer trained in the page, on WebGPU or the wasm CPU path. */
export class TransformerLm {
  private constructor();
  static create(config: LmConfig): Promise<TransformerLm>;
  /** One optimizer step on equal-length id sequences (at most maxSeqLen + 1 ids each). */
  trainStep(batch: (number[] | Uint32Array)[], options?: { clip?: number }): Promise<LmStep>;
  /** Mean loss per token, forward only. */
  evaluate(batch: (number[] | Uint32Array)[]): Promise<{ loss: number; tokens: number }>;
  setLearningRate(learningRate: number): void;
  /** The F32 .rbw file: native `TransformerLm::load_bin` reads it, and so does `loadModel`. */
  toBytes(): Promise<Uint8Array>;
  info(): { vocabSize: number; dModel: number; nLayers: number; maxSeqLen: number; parameters: number; steps: number };
  device(): Device;
  deviceReason(): string;
  /** The trained model, loaded for generation (int8, as `loadModel` loads an F32 file). */
  toModel(tokenizer: Tokenizer | string, options?: LoadOptions): Promise<Model>;
  dispose(): void;
  free(): void;
}
