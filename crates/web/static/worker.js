// The page's Web Worker: it owns the wasm module and the WebGPU device, so reading a file,
// loading a model and generating never hold up the page. Each message is a command
// ({id, cmd, ...}); replies carry the same id: `progress`, `piece` (streamed text), then `done`
// with a value or `error` with a message (`fatal` when the wasm instance trapped and the page
// must start a new worker).
import init, { init_device, GgufBytes, load_model, check_kernels } from './pkg/burn_gguf_web.js';

// The browser's WGSL compiler reports a shader's errors only to whoever asks: log them, with
// the kernel's name and the offending line, so a kernel Chrome's Tint rejects says why.
if (self.GPUDevice) {
  const create = GPUDevice.prototype.createShaderModule;
  GPUDevice.prototype.createShaderModule = function (descriptor) {
    const module = create.call(this, descriptor);
    module.getCompilationInfo().then((info) => {
      const lines = descriptor.code.split('\n');
      for (const m of info.messages.filter((m) => m.type === 'error')) {
        console.error(
          `WGSL error in ${descriptor.label || 'a shader'} at ${m.lineNum}:${m.linePos}: ` +
            `${m.message} | ${(lines[m.lineNum - 1] || '').trim()}`,
        );
      }
    });
    return module;
  };
}

const ready = init();
let model = null;
let queue = Promise.resolve();

self.onmessage = (event) => {
  // One command at a time, in order: a load never races a generation.
  queue = queue.then(() => handle(event.data));
};

function post(id, type, data = {}) {
  self.postMessage({ id, type, ...data });
}

function messageOf(e) {
  if (e instanceof Error) return e.message;
  return String(e);
}

async function handle({ id, cmd, ...args }) {
  try {
    await ready;
    switch (cmd) {
      case 'device':
        post(id, 'done', { value: JSON.parse(await init_device()) });
        break;
      case 'load': {
        if (model) {
          model.free();
          model = null;
        }
        const bytes = await readSource(id, args.source);
        post(id, 'progress', { stage: 'loading', received: bytes.length, total: bytes.length });
        model = await load_model(bytes);
        post(id, 'done', { value: JSON.parse(model.info()) });
        break;
      }
      case 'generate': {
        if (!model) throw new Error('no model is loaded');
        const out = await model.generate(JSON.stringify(args.request), (piece) =>
          post(id, 'piece', { piece }),
        );
        post(id, 'done', { value: JSON.parse(out) });
        break;
      }
      case 'reset-chat':
        if (model) model.reset_chat();
        post(id, 'done', { value: null });
        break;
      case 'check-kernels':
        post(id, 'done', { value: JSON.parse(await check_kernels()) });
        break;
      default:
        throw new Error(`unknown command ${cmd}`);
    }
  } catch (e) {
    const fatal = e instanceof WebAssembly.RuntimeError;
    if (fatal) model = null;
    post(id, 'error', { message: messageOf(e), fatal });
  }
}

// Streams a URL's body or a File into wasm memory chunk by chunk (never a second whole copy
// in JavaScript), reporting progress at most five times a second.
async function readSource(id, source) {
  let stream;
  let total;
  if (source.file) {
    stream = source.file.stream();
    total = source.file.size;
  } else {
    const response = await fetch(source.url);
    if (!response.ok) {
      throw new Error(`${source.url}: HTTP ${response.status} ${response.statusText}`);
    }
    const length = Number(response.headers.get('Content-Length'));
    total = Number.isFinite(length) && length > 0 ? length : undefined;
    stream = response.body;
  }
  const bytes = new GgufBytes(total);
  const reader = stream.getReader();
  let last = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    bytes.push(value);
    const now = performance.now();
    if (now - last > 200) {
      post(id, 'progress', { stage: 'reading', received: bytes.length, total });
      last = now;
    }
  }
  return bytes;
}
