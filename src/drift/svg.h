// A small SVG line-plot writer for the drift report: linear or log axes, one polyline per
// series, an optional min-max band per series, a legend. Self-written so the report needs no
// plotting package.
#pragma once

#include <string>
#include <vector>

namespace replayssm::drift {

struct PlotSeries {
  std::string name;
  std::string color;  // any SVG colour, e.g. "#1f77b4"
  bool dashed = false;
  std::vector<double> x, y;        // the line
  std::vector<double> y_lo, y_hi;  // optional band, same length as x (empty: none)
};

struct Plot {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  int width = 820, height = 480;
  std::vector<PlotSeries> series;
  // Points with a non-finite coordinate, or a non-positive one on a log axis, are skipped.
  std::string render() const;
};

// A colour for the i-th series of a plot (10 distinguishable colours, then repeats).
const char* plot_color(int index);

}  // namespace replayssm::drift
