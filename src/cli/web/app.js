// The page of h3run serve: plain JavaScript, no build step. It talks to the API under /api/ (docs/openapi.yaml).
'use strict';

const token = new URLSearchParams(location.search).get('token');
const $ = (id) => document.getElementById(id);
const withToken = (url) => (token ? url + (url.includes('?') ? '&' : '?') + 'token=' + encodeURIComponent(token) : url);

async function api(method, url, body) {
  const headers = {};
  if (token) headers.Authorization = 'Bearer ' + token;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let data = null;
  try { data = await r.json(); } catch (e) { data = { error: 'the server answered ' + r.status }; }
  return { status: r.status, ok: r.ok, data };
}

// ---- the request and its rules (the server checks them again: its messages are the CLI's) ----

let info = null;

function nearestFrames(f) {
  const n = Math.max(0, Math.floor((f - 5) / 17));
  return [17 * n + 5, 17 * (n + 1) + 5];
}

// The rule a value breaks, in the words of the CLI, or '' when it keeps them all.
function localRule(req) {
  if (req.frames !== undefined) {
    if (!Number.isInteger(req.frames) || req.frames < 1) return 'frames must be a whole number >= 1';
    if ((req.frames - 5) % 17 !== 0) {
      const [lo, hi] = nearestFrames(req.frames);
      return `frames must be 17n+5 (the video VAE's chunks); got ${req.frames}: the nearest are ${lo} and ${hi}`;
    }
  }
  if (req.size !== undefined) {
    const m = /^(\d+)x(\d+)$/.exec(req.size);
    if (!m) return 'the canvas is WxH, e.g. 128x128';
    const w = +m[1], h = +m[2];
    if (w % 32 || h % 32 || w < 32 || h < 32) return `width and height must be multiples of 32 (at least 32); got ${w}x${h}`;
    if (w > 4 * h || h > 4 * w) return `the aspect ratio must lie within 1:4..4:1; got ${w}x${h}`;
  }
  if (req.window !== undefined && (!Number.isInteger(req.window) || req.window < 22 || (req.window - 5) % 17 !== 0))
    return `the window must be a frame count of the form 17n+5, at least 22; got ${req.window}`;
  if (req.steps !== undefined && (!Number.isInteger(req.steps) || req.steps < 1 || req.steps > 1000))
    return 'steps must be a whole number from 1 to 1000';
  return '';
}

function readForm() {
  const req = { prompt: $('prompt').value };
  const len = $('length').value.trim();
  if (len !== '') {
    if ($('lenkind').value === 'frames') req.frames = Number(len);
    else req.seconds = Number(len);
  }
  const win = $('window').value.trim();
  if (win !== '') req.window = Number(win);
  const size = $('size').value.trim();
  if (size !== '') req.size = size;
  const steps = $('steps').value.trim();
  if (steps !== '') req.steps = Number(steps);
  req.sampler = $('sampler').value;
  req.scheduler = $('scheduler').value;
  const seed = $('seed').value.trim();
  if (seed !== '') req.seed = Number(seed);
  if ($('wav').checked) req.wav = true;
  if ($('cache').checked) req.cache = true;
  if (keyframes.first_frame) req.first_frame = keyframes.first_frame;
  if (keyframes.last_frame) req.last_frame = keyframes.last_frame;
  if (keyframes.audio) req.audio = keyframes.audio;
  const loras = [...document.querySelectorAll('#loras .lora')]
    .filter((row) => row.querySelector('input[type=checkbox]').checked)
    .map((row) => ({ name: row.dataset.name, strength: Number(row.querySelector('input[type=number]').value) }));
  if (loras.length) req.loras = loras;
  return req;
}

// One row per LoRA of the server's folder: a box to use it and its strength.
function loraRow(l) {
  const box = el('input', { type: 'checkbox', oninput: schedulePlan });
  const strength = el('input', { type: 'number', value: '1', min: '-100', max: '100', step: '0.05', oninput: schedulePlan });
  const row = el('label', { class: 'lora check' }, box, ` ${l.name} (${(l.bytes / 1048576).toFixed(1)} MiB) `, strength);
  row.dataset.name = l.name;
  return row;
}

// The chosen keyframe images and soundtrack as data: URLs (the server takes base64, a data: URL's prefix allowed).
const keyframes = { first_frame: null, last_frame: null, audio: null };
function readKeyframe(id) {
  const f = $(id).files[0];
  if (!f) { keyframes[id] = null; schedulePlan(); return; }
  const r = new FileReader();
  r.onload = () => { keyframes[id] = r.result; schedulePlan(); };
  r.readAsDataURL(f);
}

let planTimer = null;
let planSeq = 0;

function showRule(text, ok) {
  $('rule').textContent = text;
  $('rule').className = ok ? 'rule ok' : 'rule';
}

// The plan before submitting: the server resolves and plans the request as it would run it.
async function refreshPlan() {
  const req = readForm();
  const rule = localRule(req);
  if (rule) {
    showRule(rule, false);
    $('plan').textContent = '';
    $('submit').disabled = true;
    return;
  }
  const seq = ++planSeq;
  const r = await api('POST', '/api/plan', req);
  if (seq !== planSeq) return;
  if (!r.ok) {
    showRule(r.data.error || 'refused', false);
    $('plan').textContent = '';
    $('submit').disabled = true;
    return;
  }
  const q = r.data.request;
  const wins = q.windows ? `, in ${q.windows} windows of ${q.window} frames` : '';
  showRule(`${q.frames} frames (${q.seconds.toFixed(2)} s)${wins} at ${q.size}, ${q.steps} steps of ${q.sampler} on ${q.scheduler}`, true);
  $('plan').textContent = r.data.plan;
  $('submit').disabled = false;
}

function schedulePlan() {
  clearTimeout(planTimer);
  planTimer = setTimeout(refreshPlan, 250);
}

async function submit(ev) {
  ev.preventDefault();
  $('submit').disabled = true;
  const r = await api('POST', '/api/jobs', readForm());
  if (!r.ok) showRule(r.data.error || 'refused', false);
  else showRule(`job ${r.data.id} queued`, true);
  $('submit').disabled = false;
  refreshJobs();
}

// ---- the queue and the gallery ----

const streams = new Map(); // job id -> EventSource
const live = new Map();    // job id -> {stage, step, steps, eta_s, fraction}

const fmtTime = (s) => (s === undefined || s === null || s < 0 ? '?' : s < 60 ? s.toFixed(1) + ' s' : Math.floor(s / 60) + ' min ' + Math.round(s % 60) + ' s');
// the stages of some runs only (keyframes, soundtrack, refine) hold their place
const STAGE_W = { tokenize: 0.01, text_encoder: 0.04, keyframes: 0, soundtrack: 0, dit: 0.80, refine: 0, audio_vae: 0.03,
  video_vae: 0.10, mux: 0.02 };

function fraction(ev) {
  let before = 0;
  for (const [name, w] of Object.entries(STAGE_W)) {
    if (name === ev.stage) return before + w * (ev.steps ? (ev.event === 'stage_end' ? 1 : ev.step / ev.steps) : (ev.event === 'stage_end' ? 1 : 0));
    before += w;
  }
  return 1;
}

function follow(id) {
  if (streams.has(id)) return;
  const es = new EventSource(withToken(`/api/jobs/${id}/events`));
  es.addEventListener('progress', (m) => {
    const ev = JSON.parse(m.data);
    live.set(id, { stage: ev.stage, step: ev.step, steps: ev.steps, eta_s: ev.eta_s, fraction: fraction(ev), event: ev.event });
    drawProgress(id);
  });
  es.addEventListener('status', (m) => {
    const job = JSON.parse(m.data);
    if (['done', 'failed', 'cancelled', 'gone'].includes(job.state)) {
      es.close();
      streams.delete(id);
      refreshJobs();
    }
  });
  es.onerror = () => { es.close(); streams.delete(id); };
  streams.set(id, es);
}

function drawProgress(id) {
  const li = document.querySelector(`#queue li[data-id="${id}"]`);
  const p = live.get(id);
  if (!li || !p) return;
  li.querySelector('.bar > div').style.width = (100 * p.fraction).toFixed(1) + '%';
  li.querySelector('.bar').setAttribute('aria-valuenow', (100 * p.fraction).toFixed(0));
  const step = p.steps ? ` step ${p.step}/${p.steps}` : '';
  li.querySelector('.stat').textContent = `running: ${p.stage}${step}, ETA of the stage ${fmtTime(p.eta_s)}`;
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}

async function cancelJob(id) { await api('POST', `/api/jobs/${id}/cancel`); refreshJobs(); }
async function deleteJob(id) { await api('DELETE', `/api/jobs/${id}`); refreshJobs(); }

function queueItem(job) {
  const li = el('li', { 'data-id': job.id, 'data-state': job.state });
  li.append(el('div', { class: 'jobhead' },
    el('span', { class: 'jobprompt', title: job.request.prompt }, `#${job.id} ${job.request.prompt || '(empty prompt)'}`),
    el('button', { class: 'small', type: 'button', onclick: () => cancelJob(job.id) }, 'Cancel')));
  li.append(el('div', { class: 'bar', role: 'progressbar', 'aria-valuemin': '0', 'aria-valuemax': '100' }, el('div')));
  li.append(el('div', { class: 'stat' }, job.state));
  return li;
}

function galleryCard(job) {
  const card = el('div', { class: 'card', 'data-id': job.id, 'data-state': job.state });
  card.append(el('div', { class: 'jobprompt', title: job.request.prompt }, `#${job.id} ${job.request.prompt || '(empty prompt)'}`));
  if (job.state === 'done') {
    card.append(el('video', { controls: '', preload: 'metadata', src: withToken(job.outputs.video) }));
    const rep = job.report || {};
    card.append(el('div', { class: 'stat' }, `${rep.frames} frames at ${rep.width}x${rep.height}, ${rep.steps} steps, seed ${rep.seed}; ${fmtTime(rep.total_s)}` +
      (rep.reused && rep.reused.length ? `; reused ${rep.reused.join(', ')}` : '')));
    const actions = el('div', { class: 'actions' }, el('a', { href: withToken(job.outputs.video), download: `h3run-${job.id}.mp4` }, 'MP4'));
    if (job.outputs.wav) actions.append(el('a', { href: withToken(job.outputs.wav), download: `h3run-${job.id}.wav` }, 'WAV'));
    actions.append(el('button', { class: 'small', type: 'button', onclick: () => deleteJob(job.id) }, 'Delete'));
    card.append(actions);
  } else {
    card.append(el('div', { class: job.state === 'failed' ? 'failed' : 'stat' }, `${job.state}: ${job.message || ''}`));
    card.append(el('div', { class: 'actions' }, el('button', { class: 'small', type: 'button', onclick: () => deleteJob(job.id) }, 'Delete')));
  }
  return card;
}

let shownKey = '';

async function refreshJobs() {
  const r = await api('GET', '/api/jobs');
  if (!r.ok) return;
  const jobs = r.data.jobs;
  const active = jobs.filter((j) => ['queued', 'planning', 'running'].includes(j.state));
  const ended = jobs.filter((j) => !active.includes(j)).reverse();
  const key = JSON.stringify(jobs.map((j) => [j.id, j.state]));
  for (const j of active) {
    if (j.progress && !live.has(j.id)) live.set(j.id, j.progress);
    if (j.state !== 'queued') follow(j.id);
  }
  if (key === shownKey) return;
  shownKey = key;
  $('queue').replaceChildren(...active.map(queueItem));
  $('queue-empty').hidden = active.length > 0;
  for (const j of active) drawProgress(j.id);
  // finished cards stay as they are (a playing video is not reloaded); new ones are added, deleted ones go
  const gallery = $('gallery');
  const have = new Map([...gallery.children].map((c) => [c.dataset.id + ':' + c.dataset.state, c]));
  gallery.replaceChildren(...ended.map((j) => have.get(j.id + ':' + j.state) || galleryCard(j)));
}

async function init() {
  const r = await api('GET', '/api/info');
  if (r.ok) {
    info = r.data;
    $('model').textContent = `${info.model}${info.small_model ? ' (the small model)' : ''} on ${info.device}`;
    $('sampler').replaceChildren(...info.samplers.map((s) => el('option', { value: s }, s)));
    $('scheduler').replaceChildren(...info.schedulers.map((s) => el('option', { value: s }, s)));
    $('length').value = info.defaults.frames;
    $('size').value = info.defaults.size;
    $('steps').placeholder = `${info.defaults.steps_h3} (h3) / ${info.defaults.steps_other}`;
    const loras = info.loras || [];
    $('loras').replaceChildren(...loras.map(loraRow));
    $('loras-box').hidden = loras.length === 0;
  }
  for (const id of ['prompt', 'lenkind', 'length', 'window', 'size', 'steps', 'sampler', 'scheduler', 'seed', 'wav', 'cache'])
    $(id).addEventListener('input', schedulePlan);
  for (const id of ['first_frame', 'last_frame', 'audio']) $(id).addEventListener('change', () => readKeyframe(id));
  $('form').addEventListener('submit', submit);
  refreshPlan();
  refreshJobs();
  setInterval(refreshJobs, 2000);
}

init();
