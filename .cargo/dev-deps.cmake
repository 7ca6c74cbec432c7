# CMake toolchain file for the C and C++ libraries that dependencies build from
# source (.cargo/config.toml passes it to their build scripts).
#
# In debug and test builds (cargo sets PROFILE=debug for build scripts) HiGHS, the
# MILP solver behind the partitioner and the application planners, is compiled as
# a unity build (a few dozen large translation units instead of 235 small ones, so
# its headers are parsed once per batch) at -O1 instead of -O3. On 2 cores that
# is 118 s instead of 345 s of wall time (224 instead of 644 CPU seconds), which
# is most of the time a fresh clone's test build waits on it. The planners' tests
# (`cargo test --lib plan`) took no longer with it. Release builds are untouched.
if("$ENV{PROFILE}" STREQUAL "debug" AND CMAKE_SOURCE_DIR MATCHES "/HiGHS$")
  set(CMAKE_UNITY_BUILD ON CACHE BOOL "" FORCE)
  set(CMAKE_C_FLAGS_RELEASE "-O1 -DNDEBUG" CACHE STRING "" FORCE)
  set(CMAKE_CXX_FLAGS_RELEASE "-O1 -DNDEBUG" CACHE STRING "" FORCE)
endif()
