// Runs before the page paints (a classic, blocking script): picks the theme so there is no flash.
(function () {
  var theme = "light";
  try {
    var saved = JSON.parse(localStorage.getItem("llamba.settings") || "{}").theme;
    if (saved === "light" || saved === "dark") theme = saved;
    else if (window.matchMedia("(prefers-color-scheme: dark)").matches) theme = "dark";
  } catch (e) {
    /* private mode or bad JSON: the light theme */
  }
  document.documentElement.dataset.theme = theme;
})();
