"use strict";
// The page of tfx_transformer.serving: calls the TensorFlow Serving REST API of the same origin.
// For tests: window.lastTranslation and window.lastDetections hold the last responses,
// window.drawnBoxes what the canvas shows, and each panel's data-state is idle, loading, done
// or error once its last request is answered.

const BOX_COLOUR = "rgb(255, 0, 255)";  // opaque, drawn as integer-aligned strips
const LINE = 3;  // strip thickness, centred on the edge pixel
const $ = (id) => document.getElementById(id);
window.lastTranslation = null;
window.lastDetections = null;
window.drawnBoxes = [];

async function call(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  const response = await fetch(path, init);
  let json = null;
  try { json = await response.json(); } catch (e) { /* not JSON: reported below */ }
  if (!response.ok || json === null) {
    throw new Error(json && json.error ? json.error
      : `${path}: HTTP ${response.status} ${response.statusText}`.trim());
  }
  return json;
}

function setState(panel, state, message) {
  panel.querySelector(".status").textContent = message || "";
  panel.dataset.state = state;
}

const models = call("v1/models").then((json) => {
  const kinds = {};
  for (const model of json.models) kinds[model.kind] = model;
  const t = kinds.translator, d = kinds.detector;
  $("models").textContent = "Models: " + [
    t ? `translator (beam ${t.beam_size})` : "no translator",
    d ? `detector (${d.class_names.join(", ")})` : "no detector"].join("; ");
  if (!t) { $("translate").disabled = true; setState($("translate-panel"), "idle", "No translator is loaded."); }
  if (!d) { $("image").disabled = true; setState($("detect-panel"), "idle", "No detector is loaded."); }
  return kinds;
}).catch((error) => {
  $("models").textContent = `The models could not be listed: ${error.message}`;
  return {};
});

// --- Translation ---
let translateRequest = 0;
$("translate-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const panel = $("translate-panel"), body = $("nbest").tBodies[0], request = ++translateRequest;
  setState(panel, "loading", "Translating…");
  try {
    const json = await call("v1/models/translator:predict",
      {signature_name: "translate_nbest", instances: [$("source").value]});
    if (request !== translateRequest) return;
    const {hypotheses, scores} = json.predictions[0];
    $("translation").textContent = hypotheses[0];
    body.replaceChildren(...hypotheses.map((text, i) => {
      const row = document.createElement("tr");
      for (const cell of [String(i + 1), text, scores[i].toFixed(3)]) {
        row.appendChild(document.createElement("td")).textContent = cell;
      }
      return row;
    }));
    window.lastTranslation = json;
    setState(panel, "done");
  } catch (error) {
    if (request !== translateRequest) return;
    $("translation").textContent = "";
    body.replaceChildren();
    setState(panel, "error", error.message);
  }
});

// --- Detection ---
let shown = null;  // {image, prediction, names} of the last answered request
let detectRequest = 0;

function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error(`${file.name} could not be read`));
    reader.readAsDataURL(file);
  });
}

function loadImage(url, name) {
  return new Promise((resolve, reject) => {
    const image = new Image();
    image.onload = () => resolve(image);
    image.onerror = () => reject(new Error(`${name} is no image this browser can show`));
    image.src = url;
  });
}

async function detect(file) {
  const panel = $("detect-panel"), request = ++detectRequest;
  setState(panel, "loading", `Detecting objects in ${file.name}…`);
  try {
    const url = await readFile(file);
    const json = await call("v1/models/detector:predict", {signature_name: "serving_bytes",
      instances: [{b64: url.slice(url.indexOf(",") + 1)}]});
    const image = await loadImage(url, file.name);
    const names = ((await models).detector || {}).class_names || [];
    if (request !== detectRequest) return;
    shown = {image, prediction: json.predictions[0], names};
    window.lastDetections = json;
    draw();
    setState(panel, "done");
  } catch (error) {
    if (request !== detectRequest) return;
    setState(panel, "error", error.message);
  }
}

const clamp = (v, low, high) => Math.min(Math.max(v, low), high);

function draw() {
  const threshold = Number($("threshold").value);
  $("threshold-value").textContent = threshold.toFixed(2);
  if (!shown) return;
  const {image, prediction: {boxes, scores, labels}, names} = shown;
  const canvas = $("canvas"), width = image.naturalWidth, height = image.naturalHeight;
  canvas.width = width;  // natural size, which also clears the canvas
  canvas.height = height;
  const ctx = canvas.getContext("2d");
  ctx.drawImage(image, 0, 0);
  const fontSize = Math.max(10, Math.round(Math.min(width, height) / 30));
  ctx.font = `${fontSize}px sans-serif`;
  ctx.textBaseline = "top";
  const order = scores.map((s, i) => i).filter((i) => scores[i] >= threshold)
    .sort((a, b) => scores[a] - scores[b]);  // the best box is drawn last, on top
  const half = (LINE - 1) / 2;
  const drawn = order.map((i) => {
    // Edge pixels of the box clipped to the image: pixel c covers [c, c + 1).
    const [x0, y0, x1, y1] = boxes[i];
    const left = clamp(Math.round(x0), 0, width - 1), top = clamp(Math.round(y0), 0, height - 1);
    const right = clamp(Math.round(x1) - 1, left, width - 1);
    const bottom = clamp(Math.round(y1) - 1, top, height - 1);
    const text = `${names[labels[i]] ?? `class ${labels[i]}`} ${scores[i].toFixed(2)}`;
    const w = Math.ceil(ctx.measureText(text).width) + 4, h = fontSize + 4;
    const x = clamp(left - half, 0, Math.max(0, width - w));
    const y = top - half - h >= 0 ? top - half - h : Math.min(top + half + 1, Math.max(0, height - h));
    return {index: i, score: scores[i], rect: [left, top, right, bottom], label: [x, y, w, h], text};
  });
  ctx.fillStyle = BOX_COLOUR;
  for (const {rect: [l, t, r, b]} of drawn) {
    ctx.fillRect(l - half, t - half, r - l + LINE, LINE);
    ctx.fillRect(l - half, b - half, r - l + LINE, LINE);
    ctx.fillRect(l - half, t - half, LINE, b - t + LINE);
    ctx.fillRect(r - half, t - half, LINE, b - t + LINE);
  }
  for (const {label: [x, y, w, h], text} of drawn) {
    ctx.fillStyle = BOX_COLOUR;
    ctx.fillRect(x, y, w, h);
    ctx.fillStyle = "#000";
    ctx.fillText(text, x + 2, y + 2);
  }
  window.drawnBoxes = drawn;
  $("detections").replaceChildren(...drawn.slice().reverse().map(({rect: [l, t, r, b], text}) => {
    const item = document.createElement("li");
    item.textContent = `${text} at (${l}, ${t})–(${r + 1}, ${b + 1})`;
    return item;
  }));
  $("detect-summary").textContent = `${drawn.length} of ${scores.length} boxes score at least ${threshold.toFixed(2)}.`;
}

$("threshold").addEventListener("input", draw);
$("image").addEventListener("change", (event) => {
  if (event.target.files.length) detect(event.target.files[0]);
});
const drop = $("drop");
drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (event) => {
  event.preventDefault();
  drop.classList.remove("over");
  if (event.dataTransfer.files.length && !$("image").disabled) detect(event.dataTransfer.files[0]);
});
