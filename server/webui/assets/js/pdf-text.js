// The text of a PDF, by pdf.js (assets/vendor/pdfjs), loaded on the first PDF attached. Its worker is a
// script of the page's own origin (the CSP's worker-src 'self'); pdf.js is told not to compile code
// (isEvalSupported: false: the CSP has no unsafe-eval) and fetches nothing else for text alone.
let loading = null;

function pdfjs() {
  loading ||= import("../vendor/pdfjs/pdf.min.mjs").then((lib) => {
    lib.GlobalWorkerOptions.workerSrc = new URL("../vendor/pdfjs/pdf.worker.min.mjs", import.meta.url).href;
    return lib;
  });
  return loading;
}

/** The PDF's text, page after page (a blank line between pages). */
export async function pdfText(bytes) {
  const lib = await pdfjs();
  const task = lib.getDocument({ data: bytes, isEvalSupported: false, useSystemFonts: false });
  const doc = await task.promise;
  try {
    const pages = [];
    for (let n = 1; n <= doc.numPages; n += 1) {
      const page = await doc.getPage(n);
      const content = await page.getTextContent();
      pages.push(
        content.items
          .map((item) => (item.str || "") + (item.hasEOL ? "\n" : ""))
          .join("")
          .trim(),
      );
    }
    return pages.join("\n\n").trim();
  } finally {
    await task.destroy();
  }
}
