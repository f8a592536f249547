// The web page of h3run serve in headless Chromium (tests/cli_serve_page.sh runs it): it loads, shows the plan of
// the request before submitting, submits a prompt, sees the job's progress bar move, plays the finished clip in the
// gallery's player, and saves a screenshot.
// Usage: node serve_page.js URL SCREENSHOT.png   (CHROMIUM: the browser, default /usr/bin/chromium)
'use strict';
const puppeteer = require('puppeteer-core');

const [url, shot] = process.argv.slice(2);
const fails = [];
const check = (cond, msg) => { if (!cond) { fails.push(msg); console.log('FAIL: ' + msg); } return cond; };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--autoplay-policy=no-user-gesture-required', '--mute-audio'],
  });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1200, height: 900 });
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(url, { waitUntil: 'networkidle0' });
    await page.waitForFunction(() => document.querySelectorAll('#sampler option').length === 3, { timeout: 20000 });

    // a rule broken: the page says so and will not submit
    await page.$eval('#length', (e) => { e.value = '50'; e.dispatchEvent(new Event('input')); });
    await page.waitForFunction(() => /17n\+5/.test(document.querySelector('#rule').textContent), { timeout: 10000 });
    check(await page.$eval('#submit', (b) => b.disabled), 'the page refuses 50 frames');

    // the request, and its plan before submitting
    await page.$eval('#length', (e) => { e.value = '56'; e.dispatchEvent(new Event('input')); });
    await page.$eval('#steps', (e) => { e.value = '30'; e.dispatchEvent(new Event('input')); });
    await page.type('#prompt', 'a red circle moves from left to right, a rising tone');
    await page.waitForFunction(() => /host memory/.test(document.querySelector('#plan').textContent) &&
                               !document.querySelector('#submit').disabled, { timeout: 20000 });
    const plan = await page.$eval('#plan', (e) => e.textContent);
    console.log('plan shown before submitting: ' + plan);
    // a long clip: the server's plan names its windows; a bad window is refused on the page; then back to one window
    await page.$eval('#length', (e) => { e.value = '124'; e.dispatchEvent(new Event('input')); });
    await page.$eval('#window', (e) => { e.value = '50'; e.dispatchEvent(new Event('input')); });
    await page.waitForFunction(() => /window must be/.test(document.querySelector('#rule').textContent), { timeout: 10000 });
    check(await page.$eval('#submit', (b) => b.disabled), 'the page refuses a window of 50 frames');
    await page.$eval('#window', (e) => { e.value = '56'; e.dispatchEvent(new Event('input')); });
    await page.waitForFunction(() => /in 3 windows of 56 frames/.test(document.querySelector('#rule').textContent),
                               { timeout: 20000 });
    await page.$eval('#window', (e) => { e.value = ''; e.dispatchEvent(new Event('input')); });
    await page.$eval('#length', (e) => { e.value = '56'; e.dispatchEvent(new Event('input')); });
    await page.waitForFunction(() => !/windows/.test(document.querySelector('#rule').textContent) &&
                               !document.querySelector('#submit').disabled, { timeout: 20000 });
    // the server's LoRAs (LORA_NAME: the one its folder holds), one of them chosen
    const loraName = process.env.LORA_NAME;
    if (loraName) {
      const rows = await page.$$eval('#loras .lora', (rs) => rs.map((r) => r.dataset.name));
      check(!(await page.$eval('#loras-box', (b) => b.hidden)) && rows.length === 1 && rows[0] === loraName,
            'the page offers the server\'s LoRA: ' + JSON.stringify(rows));
      await page.click('#loras .lora input[type=checkbox]');
      await page.$eval('#loras .lora input[type=number]', (e) => { e.value = '0.5'; e.dispatchEvent(new Event('input')); });
      await sleep(400);
      await page.waitForFunction(() => !document.querySelector('#submit').disabled, { timeout: 20000 });
    }
    await page.click('#submit');

    // the progress bar of the running job moves
    const widths = new Set();
    const t0 = Date.now();
    while (Date.now() - t0 < 120000) {
      const w = await page.evaluate(() => {
        const bar = document.querySelector('#queue li .bar > div');
        return bar ? parseFloat(bar.style.width) || 0 : null;
      });
      if (w !== null && w > 0 && w < 100) widths.add(Math.round(w));
      const done = await page.$('#gallery .card[data-state="done"] video');
      if (done) break;
      await sleep(100);
    }
    console.log('progress bar widths seen (%): ' + [...widths].sort((a, b) => a - b).join(' '));
    check(widths.size >= 3, 'the progress bar moved through at least 3 positions: ' + [...widths]);

    // the finished clip plays
    await page.waitForSelector('#gallery .card[data-state="done"] video', { timeout: 120000 });
    const played = await page.$eval('#gallery .card[data-state="done"] video', async (v) => {
      v.muted = true;
      await new Promise((res, rej) => {
        if (v.readyState >= 2) return res();
        v.addEventListener('loadeddata', res, { once: true });
        v.addEventListener('error', () => rej(new Error('the video element: error ' + (v.error && v.error.code))), { once: true });
      });
      await v.play();
      const start = performance.now();
      while (v.currentTime < 0.5 && performance.now() - start < 15000) await new Promise((r) => setTimeout(r, 50));
      v.pause();
      return { currentTime: v.currentTime, duration: v.duration, width: v.videoWidth, height: v.videoHeight };
    });
    console.log('the clip played: ' + JSON.stringify(played));
    check(played.currentTime >= 0.5, 'the clip played half a second: ' + played.currentTime);
    check(Math.abs(played.duration - 56 / 24) < 0.1 && played.width === 128 && played.height === 128,
          'the clip is 56 frames at 128x128: ' + JSON.stringify(played));
    const seekable = await page.$eval('#gallery .card[data-state="done"] video', (v) => v.seekable.length);
    check(seekable >= 1, 'the player can seek (range requests)');
    if (loraName) {
      const jobs = await page.evaluate(async () => (await (await fetch('/api/jobs')).json()).jobs);
      const req = jobs.length ? jobs[jobs.length - 1].request : null;
      check(req && JSON.stringify(req.loras) === JSON.stringify([{ name: loraName, strength: 0.5 }]),
            'the job took the chosen LoRA at 0.5: ' + JSON.stringify(req && req.loras));
    }
    await page.screenshot({ path: shot, fullPage: true });
    console.log('screenshot: ' + shot);
    check(errors.length === 0, 'no script error on the page: ' + errors.join('; '));
  } finally {
    await browser.close();
  }
}

main().then(() => {
  console.log(`${fails.length ? 0 : 1} passed, ${fails.length ? 1 : 0} failed`);
  process.exit(fails.length ? 1 : 0);
}, (e) => {
  console.log('FAIL: ' + (e && e.stack || e));
  process.exit(1);
});
