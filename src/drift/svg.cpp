#include "drift/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace replayssm::drift {
namespace {

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// One axis: data range -> pixel range, with ticks at decades (log) or at 1/2/5 steps (linear).
struct Axis {
  bool log;
  double lo, hi;    // in data units (log: positive)
  double p0, p1;    // pixels
  double step = 1;  // linear tick spacing, chosen by fit()
  double t(double v) const { return log ? std::log10(v) : v; }
  double map(double v) const {
    const double a = t(lo), b = t(hi);
    return p0 + (t(v) - a) / (b - a) * (p1 - p0);
  }
  bool usable(double v) const { return std::isfinite(v) && (!log || v > 0); }

  void fit(double mn, double mx) {
    if (!(mn <= mx)) mn = mx = log ? 1.0 : 0.0;
    if (log) {
      lo = std::pow(10.0, std::floor(std::log10(mn)));
      hi = std::pow(10.0, std::ceil(std::log10(mx)));
      if (hi <= lo) hi = lo * 10;
    } else {
      if (mx == mn) {
        const double pad = mx == 0 ? 1.0 : std::fabs(mx) * 0.1;
        mn -= pad;
        mx += pad;
      }
      step = nice_step((mx - mn) / 6);
      lo = std::floor(mn / step) * step;
      hi = std::ceil(mx / step) * step;
    }
  }
  static double nice_step(double raw) {
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    const double r = raw / mag;
    return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
  }
  // Major ticks (labelled) and, for log axes, minor ticks at 2..9 x 10^k.
  std::vector<double> ticks(std::vector<double>* minor) const {
    std::vector<double> out;
    if (log) {
      for (double d = lo; d <= hi * 1.0001; d *= 10) {
        out.push_back(d);
        for (int m = 2; m < 10 && minor && d * m < hi; ++m) minor->push_back(d * m);
      }
      // Too many decades: label every second or third one.
      if (out.size() > 9) {
        std::vector<double> thin;
        const size_t every = (out.size() + 7) / 8;
        for (size_t i = 0; i < out.size(); i += every) thin.push_back(out[i]);
        out = thin;
        if (minor) minor->clear();
      }
    } else {
      for (double v = lo; v <= hi + step * 1e-6; v += step)
        out.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
    }
    return out;
  }
  static std::string label(double v, bool log) {
    if (v == 0) return "0";
    if (log) {
      const int e = int(std::lround(std::log10(v)));
      if (e >= 0 && e <= 5) return fmt::format("{}", int64_t(std::llround(v)));
      return fmt::format("1e{}", e);
    }
    const double a = std::fabs(v);
    if (a >= 1e-3 && a < 1e5) return fmt::format("{:g}", v);
    return fmt::format("{:.0e}", v);
  }
};

}  // namespace

const char* plot_color(int index) {
  static const char* colors[] = {"#000000", "#8c564b", "#ff7f0e", "#1f77b4", "#17becf",
                                 "#d62728", "#e377c2", "#2ca02c", "#bcbd22", "#7f7f7f"};
  return colors[index % 10];
}

std::string Plot::render() const {
  const double left = 78, right = 190, top = 40, bottom = 56;
  Axis ax{log_x, 0, 1, left, width - right};
  Axis ay{log_y, 0, 1, height - bottom, top};
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const PlotSeries& s : series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!ax.usable(s.x[i])) continue;
      auto take = [&](double v) {
        if (!ay.usable(v)) return;
        ymin = std::min(ymin, v);
        ymax = std::max(ymax, v);
      };
      take(s.y[i]);
      if (!s.y_lo.empty()) take(s.y_lo[i]);
      if (!s.y_hi.empty()) take(s.y_hi[i]);
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
    }
  }
  ax.fit(xmin, xmax);
  ay.fit(ymin, ymax);

  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  o += fmt::format("<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
                   (left + width - right) / 2, escape(title));
  // Grid and tick labels.
  std::vector<double> xminor, yminor;
  const std::vector<double> xt = ax.ticks(&xminor), yt = ay.ticks(&yminor);
  for (double v : xminor)
    o += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#f0f0f0\"/>\n",
        ax.map(v), top, height - bottom);
  for (double v : yminor)
    o += fmt::format(
        "<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#f0f0f0\"/>\n",
        ay.map(v), left, width - right);
  for (double v : xt) {
    const double px = ax.map(v);
    o += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#d8d8d8\"/>\n", px, top,
        height - bottom);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", px,
                     height - bottom + 16, Axis::label(v, log_x));
  }
  for (double v : yt) {
    const double py = ay.map(v);
    o += fmt::format(
        "<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#d8d8d8\"/>\n", py,
        left, width - right);
    o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6,
                     py + 4, Axis::label(v, log_y));
  }
  o += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
      "stroke=\"#444\"/>\n",
      left, top, width - right - left, height - bottom - top);
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                   (left + width - right) / 2, height - 14, escape(x_label));
  o += fmt::format(
      "<text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">{}"
      "</text>\n",
      (top + height - bottom) / 2, escape(y_label));

  // Bands first, lines on top, so no band hides a line.
  for (const PlotSeries& s : series) {
    if (s.y_lo.empty() || s.y_hi.empty()) continue;
    std::string up, down;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!ax.usable(s.x[i]) || !ay.usable(s.y_lo[i]) || !ay.usable(s.y_hi[i])) continue;
      up += fmt::format("{:.1f},{:.1f} ", ax.map(s.x[i]), ay.map(s.y_hi[i]));
      down = fmt::format("{:.1f},{:.1f} ", ax.map(s.x[i]), ay.map(s.y_lo[i])) + down;
    }
    if (!up.empty())
      o += fmt::format(
          "<polygon points=\"{}{}\" fill=\"{}\" fill-opacity=\"0.15\" "
          "stroke=\"none\"/>\n",
          up, down, s.color);
  }
  int legend = 0;
  for (const PlotSeries& s : series) {
    std::string pts;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!ax.usable(s.x[i]) || !ay.usable(s.y[i])) continue;
      pts += fmt::format("{:.1f},{:.1f} ", ax.map(s.x[i]), ay.map(s.y[i]));
    }
    const std::string dash = s.dashed ? " stroke-dasharray=\"6,3\"" : "";
    if (!pts.empty())
      o += fmt::format(
          "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\"{}>"
          "<title>{}</title></polyline>\n",
          pts, s.color, dash, escape(s.name));
    const double ly = top + 10 + 18 * legend++;
    const double lx = width - right + 12;
    o += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        lx, ly, lx + 24, ly, s.color, dash);
    o += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", lx + 30, ly + 4, escape(s.name));
  }
  o += "</svg>\n";
  return o;
}

}  // namespace replayssm::drift
