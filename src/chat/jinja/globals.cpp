// Global functions: jinja2's range/dict/namespace/cycler/joiner (with the
// sandbox's range limit) and HF's raise_exception and strftime_now.
#include <ctime>
#include <memory>

#include "chat/jinja/builtins.h"
#include "chat/jinja/objects.h"
#include "core/error.h"

namespace megactx::jinja {

namespace {

// jinja2.sandbox.MAX_RANGE
constexpr int64_t kMaxRange = 100000;

Value function(const std::string& name, BuiltinFunction::Function f) {
  return Value::make_object(std::make_shared<BuiltinFunction>(name, std::move(f)));
}

int64_t int_arg(const Value& v) {
  if (!v.is_int()) fail("'{}' object cannot be interpreted as an integer", type_name(v));
  return v.integer;
}

Value range(Interpreter&, const CallArgs& args) {
  if (args.args.empty() || args.args.size() > 3 || !args.kwargs.empty())
    fail("range expected 1 to 3 integer arguments");
  int64_t start = 0, stop, step = 1;
  if (args.args.size() == 1) {
    stop = int_arg(args.args[0]);
  } else {
    start = int_arg(args.args[0]);
    stop = int_arg(args.args[1]);
    if (args.args.size() == 3) step = int_arg(args.args[2]);
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  // Count without overflow: values are clamped to the sandbox limit first.
  __int128 count = step > 0 ? ((__int128)stop - start + step - 1) / step
                            : ((__int128)start - stop - step - 1) / -step;
  if (count < 0) count = 0;
  if (count > kMaxRange)
    fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange);
  List out;
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i)
    out.push_back(Value::from_int(start + i * step));
  return Value::make_list(std::move(out));
}

class Cycler : public Object, public std::enable_shared_from_this<Cycler> {
 public:
  explicit Cycler(List items) : items_(std::move(items)) {}
  std::string type_name() const override { return "Cycler"; }
  Value get_attr(const std::string& name) const override {
    auto self = std::const_pointer_cast<Cycler>(shared_from_this());
    if (name == "current") return items_[position_];
    if (name == "next")
      return function("next", [self](Interpreter&, const CallArgs&) {
        Value v = self->items_[self->position_];
        self->position_ = (self->position_ + 1) % self->items_.size();
        return v;
      });
    if (name == "reset")
      return function("reset", [self](Interpreter&, const CallArgs&) {
        self->position_ = 0;
        return Value::none();
      });
    return Object::get_attr(name);
  }

 private:
  List items_;
  size_t position_ = 0;
};

class Joiner : public Object {
 public:
  explicit Joiner(std::string separator) : separator_(std::move(separator)) {}
  std::string type_name() const override { return "Joiner"; }
  bool is_callable() const override { return true; }
  Value call(Interpreter&, const CallArgs&) override {
    if (!used_) {
      used_ = true;
      return Value::string("");
    }
    return Value::string(separator_);
  }

 private:
  std::string separator_;
  bool used_ = false;
};

}  // namespace

void add_global_functions(Dict& globals) {
  globals.set(Value::string("range"), function("range", range));
  globals.set(Value::string("dict"), function("dict", [](Interpreter&, const CallArgs& args) {
                Value d = Value::make_dict();
                for (const Value& source : args.args) {
                  if (!source.is_dict()) fail("dict() positional argument must be a mapping");
                  for (const auto& [k, v] : source.dict->entries) d.dict->set(k, v);
                }
                for (const auto& [k, v] : args.kwargs) d.dict->set(Value::string(k), v);
                d.update_nesting();
                return d;
              }));
  globals.set(Value::string("namespace"),
              function("namespace", [](Interpreter& interpreter, const CallArgs& args) {
                auto ns = std::make_shared<Namespace>();
                for (const Value& source : args.args) {
                  if (!source.is_dict()) fail("namespace() positional argument must be a mapping");
                  for (const auto& [k, v] : source.dict->entries) ns->set(k, v);
                }
                for (const auto& [k, v] : args.kwargs) ns->set(Value::string(k), v);
                interpreter.track(ns);
                return Value::make_object(ns);
              }));
  globals.set(Value::string("cycler"), function("cycler", [](Interpreter&, const CallArgs& args) {
                if (args.args.empty()) fail("at least one item has to be provided");
                return Value::make_object(std::make_shared<Cycler>(args.args));
              }));
  globals.set(Value::string("joiner"), function("joiner", [](Interpreter&, const CallArgs& args) {
                std::string separator = args.get(0, "sep", Value::string(", ")).text;
                return Value::make_object(std::make_shared<Joiner>(separator));
              }));
  globals.set(Value::string("raise_exception"),
              function("raise_exception", [](Interpreter&, const CallArgs& args) -> Value {
                throw TemplateRaised{to_str(args.get(0, "message"))};
              }));
  globals.set(Value::string("strftime_now"),
              function("strftime_now", [](Interpreter&, const CallArgs& args) {
                std::string format = to_str(args.get(0, "format"));
                std::time_t now = std::time(nullptr);
                std::tm local{};
                localtime_r(&now, &local);
                char buffer[512];
                size_t n = format.empty()
                               ? 0
                               : std::strftime(buffer, sizeof(buffer), format.c_str(), &local);
                return Value::string(std::string(buffer, n));
              }));
}

}  // namespace megactx::jinja
