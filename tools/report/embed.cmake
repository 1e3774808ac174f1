# SPDX-License-Identifier: Apache-2.0
# embed.cmake — turn the report page (page.html, kept readable as HTML) into a
# C header holding it as a byte array: cmake -DIN=page.html -DOUT=x.h -P embed.cmake
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE ${OUT} "/* Generated from tools/report/page.html by embed.cmake: do not edit. */\n"
     "static const unsigned char report_page[${bytes}] = {\n${body}\n};\n")
