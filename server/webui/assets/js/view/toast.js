// Short notices in the corner, read out by screen readers (the container is a polite live region).
import { h } from "../dom.js";

export function toast(message, kind = "info", ms = 4000) {
  const root = document.getElementById("toasts");
  const el = h("div", { class: `toast toast-${kind}` }, message);
  root.append(el);
  setTimeout(() => {
    el.classList.add("leaving");
    setTimeout(() => el.remove(), 300);
  }, ms);
}
