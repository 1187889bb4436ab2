// Trajectory viewer page: lists iterations and episodes, replays one episode turn by turn.
// Every text from the run is inserted with textContent (model output is untrusted).
"use strict";

const POLL_MS = 2000;
const state = { iteration: null, index: null, iterationsKey: "" };

async function api(path) {
  const response = await fetch(path);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function fmt(value, digits = 3) {
  return typeof value === "number" ? value.toFixed(digits) : "–";
}

function showError(message) {
  const box = document.getElementById("error");
  box.hidden = !message;
  box.textContent = message || "";
}

async function loadRun() {
  const run = await api("/api/run");
  document.getElementById("run-info").textContent =
    `${run.name} · env ${run.env} · model ${run.model} · ${run.iterations} iterations planned`;
  document.title = `${run.name} · agentgym-rl viewer`;
}

// A multi-env run's metrics line has env/<name>/<key> for each env: [[name, value], ...] of one key.
function perEnv(m, key) {
  const suffix = `/${key}`;
  return Object.keys(m)
    .filter((k) => k.startsWith("env/") && k.endsWith(suffix))
    .map((k) => [k.slice("env/".length, -suffix.length), m[k]]);
}

function renderIterations(rows) {
  const body = document.querySelector("#iterations tbody");
  body.replaceChildren();
  for (const row of rows) {
    const m = row.metrics || {};
    const horizons = perEnv(m, "horizon");
    const successes = perEnv(m, "success_rate");
    const success = el("td", { text: fmt(m.success_rate, 2) });
    if (successes.length) success.title = successes.map(([name, s]) => `${name} ${fmt(s, 2)}`).join(" · ");
    const tr = el("tr", { "data-iteration": row.iteration },
      el("td", { text: row.iteration }),
      el("td", { text: horizons.length ? horizons.map(([name, h]) => `${name} ${h}`).join(" · ") : (m.horizon ?? "–") }),
      success,
      el("td", { text: fmt(m.mean_reward) }),
      el("td", { text: `${row.successes}/${row.episodes}` }));
    if (row.iteration === state.iteration) tr.classList.add("selected");
    tr.addEventListener("click", () => selectIteration(row.iteration));
    body.append(tr);
  }
}

async function pollIterations() {
  const live = document.getElementById("live");
  try {
    const rows = await api("/api/iterations");
    live.classList.remove("stale");
    live.textContent = `live · ${rows.length} iterations`;
    const key = JSON.stringify(rows.map((r) => [r.iteration, r.episodes, r.metrics !== null]));
    if (key !== state.iterationsKey) {
      state.iterationsKey = key;
      renderIterations(rows);
      if (state.iteration === null && rows.length) await selectIteration(rows[rows.length - 1].iteration);
    }
  } catch (err) {
    live.classList.add("stale");
    live.textContent = `not reachable: ${err.message}`;
  }
}

function filterQuery() {
  const params = new URLSearchParams({ iteration: state.iteration });
  for (const [key, value] of new FormData(document.getElementById("filters"))) {
    if (String(value).trim() !== "") params.set(key, String(value).trim());
  }
  return params.toString();
}

async function selectIteration(iteration) {
  state.iteration = iteration;
  for (const tr of document.querySelectorAll("#iterations tbody tr")) {
    tr.classList.toggle("selected", Number(tr.dataset.iteration) === iteration);
  }
  document.getElementById("episodes-title").textContent = `(iteration ${iteration})`;
  await loadEpisodes();
}

async function loadEpisodes() {
  const body = document.querySelector("#episodes tbody");
  let rows;
  try {
    rows = await api(`/api/episodes?${filterQuery()}`);
    showError("");
  } catch (err) {
    showError(err.message);
    return;
  }
  body.replaceChildren();
  for (const row of rows) {
    const tr = el("tr", { "data-index": row.index, "data-testid": "episode-row" },
      el("td", { text: row.index }),
      el("td", { text: row.env }),
      el("td", { text: row.task_id }),
      el("td", { text: row.group }),
      el("td", { text: fmt(row.reward) }),
      el("td", { text: row.success ? "yes" : "no", class: row.success ? "ok" : "bad" }),
      el("td", { text: row.turns }),
      el("td", { text: row.truncated ? row.truncation_reason || "yes" : "no" }),
      el("td", { text: `${row.sampled_tokens}/${row.tokens}` }));
    tr.addEventListener("click", () => showEpisode(state.iteration, row.index));
    body.append(tr);
  }
}

function frame(iteration, index, step, caption) {
  return el("figure", {},
    el("img", { class: "frame", src: `/api/frame/${iteration}/${index}/${step}.png`, alt: caption, "data-testid": "frame" }),
    el("figcaption", { class: "tokens", text: caption }));
}

function renderTurn(episode, turn) {
  let parsed;
  if (turn.action !== null) parsed = el("span", { class: "action", "data-testid": "action", text: turn.action });
  else if (turn.invalid_reason !== null) {
    parsed = el("span", { class: "invalid", "data-testid": "action", text: `invalid: ${turn.invalid_reason}` });
  } else parsed = el("span", { "data-testid": "action", text: "(parser unavailable, see the notes above)" });
  const text = el("div", {},
    el("h3", { text: `Turn ${turn.turn}` }),
    el("div", { class: "label", text: "Observation" }),
    el("pre", { "data-testid": "observation", text: turn.observation }),
    el("div", { class: "label", text: "Model output (raw)" }),
    el("pre", { "data-testid": "reply", text: turn.reply }),
    el("div", { class: "label" }, "Parsed action: ", parsed),
    el("div", { class: "label" }, "Reward: ", el("span", { "data-testid": "reward", text: fmt(turn.reward) })),
    el("details", {},
      el("summary", { class: "tokens",
        text: `tokens: ${turn.context.tokens} context + ${turn.sampled.tokens} sampled (loss-masked)` +
          (turn.sampled_mask_ok ? "" : " · loss mask does not match the turn span") }),
      el("pre", {},
        el("span", { class: "context", text: turn.context.text ?? "(no tokenizer)" }),
        el("span", { class: "sampled", "data-testid": "sampled", text: turn.sampled.text ?? "" }))));
  const grid = el("div", { class: "turn-grid" }, text,
    episode.frames ? frame(episode.iteration, episode.index, turn.turn, "before this action") : null);
  return el("li", { class: "turn", "data-testid": "turn" }, grid);
}

async function showEpisode(iteration, index) {
  let episode;
  try {
    episode = await api(`/api/episode/${iteration}/${index}`);
    showError("");
  } catch (err) {
    showError(err.message);
    return;
  }
  state.index = index;
  for (const tr of document.querySelectorAll("#episodes tbody tr")) {
    tr.classList.toggle("selected", Number(tr.dataset.index) === index);
  }
  document.getElementById("episode-panel").hidden = false;
  document.getElementById("episode-title").textContent =
    `Iteration ${iteration}, episode ${index}: ${episode.env} task ${episode.task_id}`;
  document.getElementById("episode-meta").textContent =
    `reward ${fmt(episode.reward)} · ${episode.success ? "success" : "no success"} · ` +
    `${episode.turns.length} turns (horizon ${episode.horizon}) · ` +
    `${episode.truncated ? `truncated (${episode.truncation_reason})` : episode.done ? "ended by env" : "open"} · ` +
    `${episode.sampled_tokens}/${episode.tokens} tokens sampled · weights v${episode.weights_version}`;
  document.getElementById("prompt-tokens").textContent = episode.prompt.tokens;
  document.getElementById("prompt").textContent = episode.prompt.text ?? "(no tokenizer)";
  document.getElementById("notes").textContent = episode.notes.join("\n");
  const list = document.getElementById("turns");
  list.replaceChildren(...episode.turns.map((turn) => renderTurn(episode, turn)));
  const last = episode.turns.at(-1);
  if (last && last.next_observation !== null) {
    list.append(el("li", { class: "turn final" }, el("div", { class: "label", text: "Final observation" }),
      el("pre", { text: last.next_observation })));
  }
  if (episode.frames) {
    list.append(el("li", { class: "turn final" }, frame(iteration, index, episode.turns.length, "final state")));
  }
}

document.getElementById("filters").addEventListener("input", () => {
  if (state.iteration !== null) loadEpisodes();
});
document.getElementById("filters").addEventListener("submit", (event) => event.preventDefault());

loadRun().catch((err) => showError(err.message));
pollIterations();
setInterval(pollIterations, POLL_MS);
