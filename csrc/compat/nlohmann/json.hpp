// Declarations only, for compiling against torch's functorch headers.
//
// torch 2.13's ATen/functorch/Interpreter.h (reached from PlumbingHelper.h, which the vmap batching rules
// need) includes <nlohmann/json.hpp> for Interpreter::serialize()/deserialize(), but the torch wheel does not
// ship that header. The package never serializes an interpreter: these declarations only let the header
// parse. Nothing here is defined, so any use of it would fail to link rather than misbehave.
#pragma once

#include <string>

namespace nlohmann {

class json {
 public:
  json();
  template <typename T>
  json(const T& value);
  std::string dump() const;
  static json parse(const std::string& text);
  template <typename T>
  T get() const;
};

}  // namespace nlohmann
