// The diagram frame (assets/diagram.html, a classic script: the frame has an opaque origin, so no module
// loading). The page posts {id, source, theme}; this answers {id, svg} or {id, error}, one at a time.
(function () {
  "use strict";
  var queue = Promise.resolve();
  var count = 0;

  function draw(source, theme) {
    mermaid.initialize({
      startOnLoad: false,
      securityLevel: "strict",
      theme: theme === "dark" ? "dark" : "default",
      htmlLabels: false,
      flowchart: { htmlLabels: false },
      suppressErrorRendering: true,
      secure: ["secure", "securityLevel", "startOnLoad", "maxTextSize", "htmlLabels", "themeCSS"],
    });
    count += 1;
    return mermaid.render("diagram-" + count, source);
  }

  window.addEventListener("message", function (event) {
    if (event.source !== window.parent) return;
    var job = event.data || {};
    if (typeof job.source !== "string") return;
    queue = queue.then(function () {
      return draw(job.source, job.theme).then(
        function (result) {
          window.parent.postMessage({ id: job.id, svg: result.svg }, "*");
        },
        function (err) {
          var text = String((err && err.message) || err).split("\n")[0];
          window.parent.postMessage({ id: job.id, error: text }, "*");
        },
      );
    });
  });
  window.parent.postMessage({ ready: true }, "*");
})();
