// The page: the form, the worker's replies, and the scripted mode. Opened as
//   index.html?model=URL&prompt=TEXT&n=N&temp=T   (also top_k, top_p, seed)
// it loads and generates without a click and logs one console line, `RESULT {json}` (the
// ids and text as `burn-gguf run --json` prints them) or `ERROR {json}`; opened as
//   index.html?check=kernels
// it runs the browser's kernel checks and logs `RESULT {json}` with each case and the counts.
// `window.burnGguf` offers the same calls to scripts (the browser tests use it).

const $ = (id) => document.getElementById(id);

// The worker and its pending commands. A worker whose wasm instance trapped is replaced, so
// the page stays usable after any failure.
class Engine {
  constructor() {
    this.next = 1;
    this.pending = new Map();
    this.start();
  }

  start() {
    this.worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
    this.worker.onmessage = (e) => this.onMessage(e.data);
    this.worker.onerror = (e) => {
      e.preventDefault();
      this.failAll(`the worker failed: ${e.message || 'it could not start'}`);
    };
  }

  restart() {
    this.worker.terminate();
    this.failAll('the worker was restarted');
    this.start();
  }

  failAll(message) {
    for (const p of this.pending.values()) p.reject(new Error(message));
    this.pending.clear();
  }

  call(cmd, args = {}, handlers = {}) {
    const id = this.next++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, handlers });
      this.worker.postMessage({ id, cmd, ...args });
    });
  }

  onMessage(msg) {
    const p = this.pending.get(msg.id);
    if (!p) return;
    if (msg.type === 'done') {
      this.pending.delete(msg.id);
      p.resolve(msg.value);
    } else if (msg.type === 'error') {
      this.pending.delete(msg.id);
      p.reject(new Error(msg.message));
      if (msg.fatal) this.restart();
    } else if (p.handlers[msg.type]) {
      p.handlers[msg.type](msg);
    }
  }
}

const engine = new Engine();
let loaded = null; // the model's info once one is loaded
let busy = false;
const chat = []; // the conversation in chat mode

function showError(e) {
  $('error').textContent = e ? `Error: ${e.message || e}` : '';
}

function megabytes(n) {
  return `${(n / 1e6).toFixed(1)} MB`;
}

function onProgress(msg) {
  const total = msg.total ? ` of ${megabytes(msg.total)}` : '';
  $('progress').textContent =
    msg.stage === 'reading'
      ? `reading ${megabytes(msg.received)}${total}`
      : 'parsing and uploading to the GPU…';
}

async function loadModel(source) {
  showError(null);
  loaded = null;
  $('generate').disabled = true;
  $('report').textContent = '';
  const t0 = performance.now();
  const info = await engine.call('load', { source }, { progress: onProgress });
  info.total_load_ms = performance.now() - t0;
  loaded = info;
  chat.length = 0;
  $('transcript').textContent = '';
  const fell = info.dequantized.length
    ? info.dequantized.map((d) => `\n  ${d.name} (${d.ggml_type}): ${d.reason}`).join('')
    : '';
  $('progress').textContent = `loaded in ${(info.total_load_ms / 1e3).toFixed(1)} s`;
  $('report').textContent =
    `${info.architecture}, ${megabytes(info.file_bytes)}: ${info.report}` +
    (fell ? `\ndequantized at load:${fell}` : '') +
    `\nchat template: ${info.chat_template}`;
  $('generate').disabled = false;
  return info;
}

function readOptions() {
  return {
    max_tokens: Number($('n').value),
    temperature: Number($('temp').value),
    top_k: Number($('top-k').value),
    top_p: Number($('top-p').value),
    seed: Number($('seed').value),
  };
}

function showStats(out) {
  const t = out.timings;
  $('stats').textContent =
    `prompt ${t.prompt_tokens} tokens, ${t.prompt_tokens_per_s.toFixed(1)} tokens/s | ` +
    `decode ${t.decode_tokens} tokens, ${t.decode_tokens_per_s.toFixed(2)} tokens/s`;
}

// One generation: streams pieces into the output with a live tokens/s estimate.
async function generate(request) {
  $('output').textContent = '';
  $('stats').textContent = '';
  const t0 = performance.now();
  let pieces = 0;
  const out = await engine.call(
    'generate',
    { request },
    {
      piece: (msg) => {
        pieces += 1;
        $('output').textContent += msg.piece;
        const s = (performance.now() - t0) / 1e3;
        $('stats').textContent = `${pieces} pieces in ${s.toFixed(1)} s (${(pieces / s).toFixed(2)}/s)`;
      },
    },
  );
  showStats(out);
  return out;
}

async function onGenerate() {
  if (busy || !loaded) return;
  busy = true;
  showError(null);
  $('generate').disabled = true;
  try {
    const mode = document.querySelector('input[name=mode]:checked').value;
    const text = $('prompt').value;
    if (mode === 'chat') {
      chat.push({ role: 'user', content: text });
      const out = await generate({ messages: chat, ...readOptions() });
      chat.push({ role: 'assistant', content: out.text.trim() });
      const turn = document.createElement('p');
      turn.innerHTML = '<b class="turn-user"></b><br><span></span>';
      turn.querySelector('b').textContent = text;
      turn.querySelector('span').textContent = out.text.trim();
      $('transcript').append(turn);
      $('prompt').value = '';
    } else {
      await generate({ prompt: text, ...readOptions() });
    }
  } catch (e) {
    if (document.querySelector('input[name=mode]:checked').value === 'chat') chat.pop();
    showError(e);
  } finally {
    busy = false;
    $('generate').disabled = !loaded;
  }
}

async function checkKernels() {
  $('output').textContent = 'running the kernel checks…';
  const report = await engine.call('check-kernels');
  $('output').textContent =
    report.cases
      .map((c) => `${c.passed ? 'ok  ' : 'FAIL'} ${c.variant} ${c.shape} ${c.err ?? c.error}`)
      .join('\n') + `\n${report.passed} passed, ${report.failed} failed`;
  return report;
}

// A scripted run: load `model` (a URL), generate, and resolve to `run --json`'s object with
// the load's figures added.
async function run({ model, prompt, n = 32, temp = 0, top_k = 40, top_p = 0.95, seed = 0 }) {
  const info = await loadModel({ url: model });
  // The form shows what runs.
  $('prompt').value = prompt;
  [$('n').value, $('temp').value, $('top-k').value, $('top-p').value, $('seed').value] = [
    n, temp, top_k, top_p, seed,
  ];
  document.querySelector('input[name=mode][value=complete]').checked = true;
  const out = await generate({ prompt, ...readOptions() });
  out.timings.load_ms = info.total_load_ms;
  out.model = { architecture: info.architecture, report: info.report };
  return out;
}

// The console contract of the scripted mode: one line each, also kept in window.burnGgufLog.
window.burnGgufLog = [];
function logLine(kind, value) {
  const line = `${kind} ${JSON.stringify(value)}`;
  window.burnGgufLog.push(line);
  console.log(line);
}

window.burnGguf = { run, checkKernels, loadModel, generate, logLine };

async function scripted(params) {
  try {
    let value;
    if (params.get('check') === 'kernels') {
      value = await checkKernels();
    } else {
      const args = { model: params.get('model'), prompt: params.get('prompt') ?? '' };
      for (const k of ['n', 'temp', 'top_k', 'top_p', 'seed']) {
        if (params.has(k)) args[k] = params.get(k);
      }
      value = await run(args);
    }
    logLine('RESULT', value);
  } catch (e) {
    showError(e);
    logLine('ERROR', { message: e.message || String(e) });
  }
}

async function main() {
  $('file').addEventListener('change', () => {
    const file = $('file').files[0];
    if (file) loadModel({ file }).catch(showError);
  });
  $('load-url').addEventListener('click', () => {
    const url = $('url').value.trim();
    if (url) loadModel({ url }).catch(showError);
  });
  $('generate').addEventListener('click', onGenerate);
  $('reset-chat').addEventListener('click', () => {
    chat.length = 0;
    $('transcript').textContent = '';
    engine.call('reset-chat').catch(showError);
  });
  $('check-kernels').addEventListener('click', () => checkKernels().catch(showError));

  if (!navigator.gpu) {
    $('device').textContent = 'WebGPU: not available in this browser';
  } else {
    try {
      const adapter = await navigator.gpu.requestAdapter();
      const d = await engine.call('device');
      const name = adapter?.info
        ? [adapter.info.vendor, adapter.info.architecture, adapter.info.description]
            .filter(Boolean)
            .join(' ')
        : '';
      $('device').textContent =
        `WebGPU: ${name || 'adapter'}${d.software ? ' (software)' : ''}, ` +
        `largest buffer ${megabytes(d.max_buffer_bytes)}`;
    } catch (e) {
      $('device').textContent = `WebGPU: ${e.message || e}`;
    }
  }
  const params = new URLSearchParams(location.search);
  if (params.has('model') || params.has('check')) await scripted(params);
}

main();
