// lanefold view: live updates by server-sent events, and a lane opened from its bar. Served
// from the package (the page's CSP allows no inline script); nothing fetched from elsewhere.
"use strict";
(function () {
  // A bar links to its lane (#lane-W-L): open that lane's details, whoever navigated there.
  function openLane() {
    const el = location.hash && document.getElementById(location.hash.slice(1));
    if (el && el.tagName === "DETAILS") {
      el.open = true;
      el.scrollIntoView({ block: "nearest" });
    }
  }
  window.addEventListener("hashchange", openLane);
  openLane();

  const url = document.body.dataset.live;
  if (!url) return;
  const source = new EventSource(url);
  source.addEventListener("parts", (e) => {
    const parts = JSON.parse(e.data);
    // The lanes a reader opened stay open as new ones land.
    const opened = [...document.querySelectorAll("#waves details[open]")].map((d) => d.id);
    for (const id of ["waterfall", "waves", "votes", "outcome"]) {
      const el = document.getElementById(id);
      if (el && parts[id] !== undefined) el.innerHTML = parts[id];
    }
    for (const id of opened) {
      const el = document.getElementById(id);
      if (el) el.open = true;
    }
    document.getElementById("status").textContent = parts.status;
    document.getElementById("timeline").insertAdjacentHTML("beforeend", parts.timeline);
  });
  // A live eval page: each part, by its element's id, as questions land.
  source.addEventListener("swap", (e) => {
    const parts = JSON.parse(e.data);
    for (const [id, html] of Object.entries(parts)) {
      const el = document.getElementById(id);
      if (el) el.innerHTML = html;
    }
  });
  source.addEventListener("rows", (e) => {
    const body = document.querySelector("#runs tbody");
    if (body) body.innerHTML = JSON.parse(e.data).html;
  });
  source.addEventListener("refused", (e) => {
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = JSON.parse(e.data).line;
    document.querySelector("main").prepend(p);
    source.close();
  });
  source.addEventListener("end", () => source.close());
})();
