// env_switch: unset or empty gives the default, "0" / "1" override it, and
// anything else is an error that names the variable.
#include "core/env_switch.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace megactx {
namespace {

constexpr const char* kVariable = "MEGACTX_ENV_SWITCH_TEST";

TEST(EnvSwitch, DefaultOverridesAndErrors) {
  unsetenv(kVariable);
  EXPECT_TRUE(env_switch(kVariable, true));
  EXPECT_FALSE(env_switch(kVariable, false));
  setenv(kVariable, "", 1);
  EXPECT_TRUE(env_switch(kVariable, true));
  setenv(kVariable, "1", 1);
  EXPECT_TRUE(env_switch(kVariable, false));
  setenv(kVariable, "0", 1);
  EXPECT_FALSE(env_switch(kVariable, true));
  for (const char* bad : {"yes", "2", "on", "10"}) {
    setenv(kVariable, bad, 1);
    try {
      env_switch(kVariable, false);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(kVariable), std::string::npos) << error.what();
    }
  }
  unsetenv(kVariable);
}

}  // namespace
}  // namespace megactx
