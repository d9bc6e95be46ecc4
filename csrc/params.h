// Field tables of the tunable parameter structs (CursorParams, SourceParams):
// each field's name and valid range, stated once next to the struct. The
// Python binding builds its classes from them (a checked attribute per field,
// keyword construction, equality, repr, pickling).
#ifndef REFDEC_PARAMS_H_
#define REFDEC_PARAMS_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace refdec {

// One numeric field of a parameter struct: exactly one of `real` and
// `integer` is set. Valid values lie in [lo, hi]; a real field must also be
// finite.
template <typename Params>
struct ParamField {
  const char* name;           // field name (the Python attribute)
  float Params::*real;        // the member if it is a float, else nullptr
  int32_t Params::*integer;   // the member if it is an int32, else nullptr
  double lo;                  // smallest valid value
  double hi;                  // largest valid value
};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kInt32Max = 2147483647.0;

template <typename Params>
constexpr ParamField<Params> real_field(const char* name, float Params::*member, double lo = 0.0, double hi = kInf) {
  return {name, member, nullptr, lo, hi};
}

template <typename Params>
constexpr ParamField<Params> int_field(const char* name, int32_t Params::*member, double lo = 0.0,
                                       double hi = kInt32Max) {
  return {name, nullptr, member, lo, hi};
}

// Whether `value` is valid for the field (finite for a real field).
template <typename Params>
bool in_range(const ParamField<Params>& field, double value) {
  return (field.integer != nullptr || std::isfinite(value)) && field.lo <= value && value <= field.hi;
}

// The field's value as a double.
template <typename Params>
double field_value(const Params& params, const ParamField<Params>& field) {
  return field.real != nullptr ? static_cast<double>(params.*field.real) : static_cast<double>(params.*field.integer);
}

}  // namespace refdec

#endif  // REFDEC_PARAMS_H_
